//! The deployment files under `manifests/` and the `Dockerfile`: every YAML file parses; every
//! lakecdc command line of the Kubernetes jobs and the systemd units is accepted by the binary,
//! with the environment those files give it; the alert rules use only the metrics lakecdc
//! exports; the image is built with the pinned toolchain and runs the binary as the pods' user;
//! the manifests lakecdc writes validate against `manifests/lake-manifest.schema.json`, and the
//! schema rejects what lakecdc never writes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use jsonschema::Validator;
use lakecdc::compact::{CompactOptions, Decision, Outcome};
use lakecdc::job::Context;
use serde_json::{Value, json};
use yaml_rust2::{Yaml, YamlLoader};

use crate::support::harness;
use crate::support::oracle;
use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::Rng;

/// A PostgreSQL address where the connection fails at once: a command line that gets this far
/// has been accepted (flags, environment and paths) and fails at run time with exit 1.
const UNREACHABLE: &str = "host=127.0.0.1 port=1 user=u dbname=d sslmode=disable connect_timeout=1";

fn manifests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests")
}

/// Prometheus rule files (`groups:`), not Kubernetes objects.
fn alerts_dir() -> PathBuf {
    manifests_dir().join("alerts")
}

/// Files under `dir` (recursively) whose name ends with one of `suffixes`, sorted.
fn files_with(dir: &Path, suffixes: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if suffixes.iter().any(|s| path.to_string_lossy().ends_with(s)) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// A YAML node as JSON (mapping keys must be strings, as in every Kubernetes object).
fn yaml_to_json(y: &Yaml, file: &Path) -> Value {
    match y {
        Yaml::Null => Value::Null,
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Integer(i) => json!(i),
        Yaml::Real(r) => json!(r.parse::<f64>().unwrap()),
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Array(a) => Value::Array(a.iter().map(|v| yaml_to_json(v, file)).collect()),
        Yaml::Hash(h) => Value::Object(
            h.iter()
                .map(|(k, v)| match k {
                    Yaml::String(k) => (k.clone(), yaml_to_json(v, file)),
                    other => panic!("{}: mapping key {other:?} is not a string", file.display()),
                })
                .collect(),
        ),
        other => panic!("{}: unsupported YAML node {other:?}", file.display()),
    }
}

/// Every document of a (possibly multi-document) YAML file; empty documents are dropped.
fn load_yaml(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let docs = YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", path.display()));
    docs.iter()
        .map(|d| yaml_to_json(d, path))
        .filter(|d| !d.is_null())
        .collect()
}

fn kubernetes_docs() -> Vec<(PathBuf, Value)> {
    files_with(&manifests_dir().join("kubernetes"), &[".yaml", ".yml"])
        .into_iter()
        .flat_map(|f| load_yaml(&f).into_iter().map(move |d| (f.clone(), d)))
        .collect()
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v}"))
}

#[test]
fn every_yaml_file_parses_as_kubernetes_objects() {
    let files: Vec<PathBuf> = files_with(&manifests_dir(), &[".yaml", ".yml"])
        .into_iter()
        .filter(|f| !f.starts_with(alerts_dir()))
        .collect();
    assert!(files.len() >= 9, "{files:?}");
    for file in &files {
        let docs = load_yaml(file);
        assert!(!docs.is_empty(), "{} holds no document", file.display());
        for doc in &docs {
            let what = format!("{} ({})", file.display(), doc["kind"]);
            assert!(doc["apiVersion"].is_string(), "{what}: no apiVersion");
            assert!(doc["kind"].is_string(), "{what}: no kind");
            // Kubernetes refuses non-string ConfigMap/Secret values (an unquoted 2 or true).
            for field in ["data", "stringData"] {
                if let Some(data) = doc[field].as_object()
                    && matches!(doc["kind"].as_str(), Some("ConfigMap" | "Secret"))
                {
                    for (k, v) in data {
                        assert!(v.is_string(), "{what}: {field}.{k} is not a string: {v}");
                    }
                }
            }
        }
    }
    // kustomization.yaml lists files that exist, and never the example Secret or the one-off
    // init Job.
    let kdir = manifests_dir().join("kubernetes");
    let k = &load_yaml(&kdir.join("kustomization.yaml"))[0];
    let resources: Vec<&str> = k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| str_of(r, "resource"))
        .collect();
    for r in &resources {
        assert!(kdir.join(r).is_file(), "kustomization lists missing {r}");
    }
    assert!(!resources.contains(&"secret.yaml"));
    assert!(!resources.contains(&"job-init.yaml"));
}

/// The pod specs of the Kubernetes files, with the file they come from.
fn pod_specs(docs: &[(PathBuf, Value)]) -> Vec<(PathBuf, String, Value)> {
    fn walk(file: &Path, name: &str, v: &Value, out: &mut Vec<(PathBuf, String, Value)>) {
        match v {
            Value::Object(m) => {
                if m.get("containers").is_some_and(Value::is_array) {
                    out.push((file.to_path_buf(), name.to_string(), v.clone()));
                }
                m.values().for_each(|c| walk(file, name, c, out));
            }
            Value::Array(a) => a.iter().for_each(|c| walk(file, name, c, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (file, doc) in docs {
        let name = format!("{}/{}", doc["kind"], doc["metadata"]["name"]);
        walk(file, &name, doc, &mut out);
    }
    out
}

/// Which deployed paths stand for which local ones in a command-line check.
type PathMap = Vec<(String, PathBuf)>;

fn map_path(value: &str, paths: &PathMap) -> String {
    for (from, to) in paths {
        if value == from {
            return to.display().to_string();
        }
        if let Some(rest) = value.strip_prefix(&format!("{from}/")) {
            return to.join(rest).display().to_string();
        }
    }
    value.to_string()
}

/// Runs one command line of the deployment files with the environment they give it: the
/// lake replaced by a local directory, PostgreSQL by an unreachable address, and deployed paths
/// by local ones. Returns the subcommand.
fn assert_accepted(
    origin: &str,
    args: &[String],
    mut env: BTreeMap<String, String>,
    paths: &PathMap,
) -> String {
    let sub = args
        .first()
        .unwrap_or_else(|| panic!("{origin}: no subcommand"))
        .clone();
    let lake = tempfile::tempdir().unwrap();
    let url = env
        .remove("LAKECDC_PG_URL")
        .unwrap_or_else(|| panic!("{origin}: LAKECDC_PG_URL is not set"));
    let userinfo = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .map_or("", |(user, _)| user);
    assert!(
        !url.contains("password") && !userinfo.contains(':'),
        "{origin}: the PostgreSQL URL must not carry the password (PGPASSWORD does): {url}"
    );
    let lake_url = env
        .remove("LAKECDC_LAKE")
        .unwrap_or_else(|| panic!("{origin}: LAKECDC_LAKE is not set"));
    assert!(lake_url.starts_with("s3://"), "{origin}: {lake_url}");
    // The Pushgateway stands for a local port where nothing listens: the push fails at once,
    // after the run (and is only logged).
    if let Some(url) = env.get_mut("LAKECDC_PUSHGATEWAY") {
        assert!(
            url.starts_with("http://") || url.starts_with("https://"),
            "{origin}: LAKECDC_PUSHGATEWAY {url}"
        );
        *url = format!("http://{}", closed_port());
    }
    let mut cmd = harness::bin();
    cmd.env_clear();
    for (k, v) in &env {
        cmd.env(k, map_path(v, paths));
    }
    cmd.env("LAKECDC_PG_URL", UNREACHABLE)
        .env("LAKECDC_LAKE", lake.path())
        .args(args.iter().map(|a| map_path(a, paths)));
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code();
    assert!(code.is_some(), "{origin}: {args:?} was killed: {stderr}");
    assert_ne!(
        code,
        Some(2),
        "{origin}: {args:?} is a usage or configuration error: {stderr}"
    );
    for clap_error in [
        "unexpected argument",
        "unrecognized subcommand",
        "invalid value",
    ] {
        assert!(!stderr.contains(clap_error), "{origin}: {args:?}: {stderr}");
    }
    // Got as far as connecting: everything before the connection was accepted.
    assert!(
        stderr.contains("127.0.0.1:1"),
        "{origin}: {args:?} exited {code:?} without trying PostgreSQL: {stderr}"
    );
    sub
}

/// A loopback address where nothing listens (bound, then released).
fn closed_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[test]
fn kubernetes_command_lines_are_accepted_by_the_binary() {
    let docs = kubernetes_docs();
    let objects = |kind: &str, field: &str| -> BTreeMap<String, BTreeMap<String, String>> {
        docs.iter()
            .filter(|(_, d)| d["kind"] == kind)
            .map(|(_, d)| {
                let data = d[field]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), str_of(v, k).to_string()))
                            .collect()
                    })
                    .unwrap_or_default();
                (str_of(&d["metadata"]["name"], "name").to_string(), data)
            })
            .collect()
    };
    let config_maps = objects("ConfigMap", "data");
    let secrets = objects("Secret", "stringData");
    let accounts: BTreeSet<String> = docs
        .iter()
        .filter(|(_, d)| d["kind"] == "ServiceAccount")
        .map(|(_, d)| str_of(&d["metadata"]["name"], "name").to_string())
        .collect();

    let mut checked = BTreeSet::new();
    for (file, owner, pod) in pod_specs(&docs) {
        if let Some(sa) = pod["serviceAccountName"].as_str() {
            assert!(accounts.contains(sa), "{owner}: no ServiceAccount {sa}");
        }
        // Volumes: a local directory per mount, holding the ConfigMap's files.
        let scratch = tempfile::tempdir().unwrap();
        let mut volumes = BTreeMap::new();
        for v in pod["volumes"].as_array().into_iter().flatten() {
            let name = str_of(&v["name"], "volume name");
            let dir = scratch.path().join(name);
            std::fs::create_dir(&dir).unwrap();
            if let Some(cm) = v["configMap"]["name"].as_str() {
                let data = config_maps
                    .get(cm)
                    .unwrap_or_else(|| panic!("{owner}: volume {name} names no ConfigMap {cm}"));
                for (k, content) in data {
                    std::fs::write(dir.join(k), content).unwrap();
                }
            } else {
                assert!(v["emptyDir"].is_object(), "{owner}: volume {name}: {v}");
            }
            volumes.insert(name.to_string(), dir);
        }
        for c in pod["containers"].as_array().unwrap() {
            let origin = format!("{} {owner} container {}", file.display(), c["name"]);
            if !str_of(&c["image"], "image").contains("lakecdc") {
                continue;
            }
            let mut paths: PathMap = Vec::new();
            for m in c["volumeMounts"].as_array().into_iter().flatten() {
                let name = str_of(&m["name"], "mount name");
                let dir = volumes
                    .get(name)
                    .unwrap_or_else(|| panic!("{origin}: mounts unknown volume {name}"));
                paths.push((
                    str_of(&m["mountPath"], "mountPath").to_string(),
                    dir.clone(),
                ));
            }
            // Environment as the kubelet builds it: envFrom in order, then env.
            let mut env = BTreeMap::new();
            for from in c["envFrom"].as_array().into_iter().flatten() {
                let (kind, source, name) = if from["configMapRef"].is_object() {
                    ("ConfigMap", &config_maps, &from["configMapRef"]["name"])
                } else {
                    ("Secret", &secrets, &from["secretRef"]["name"])
                };
                let name = str_of(name, "envFrom name");
                let data = source
                    .get(name)
                    .unwrap_or_else(|| panic!("{origin}: envFrom names no {kind} {name}"));
                env.extend(data.clone());
            }
            for e in c["env"].as_array().into_iter().flatten() {
                if let Some(v) = e.get("value") {
                    env.insert(
                        str_of(&e["name"], "env name").to_string(),
                        str_of(v, "env value").to_string(),
                    );
                }
            }
            // Metrics go to the Pushgateway, under a fixed `instance` (a pod's host name is
            // new at every run: each run would leave a Pushgateway group of its own).
            assert!(
                env.contains_key("LAKECDC_PUSHGATEWAY"),
                "{origin}: no LAKECDC_PUSHGATEWAY"
            );
            assert!(
                env.get("LAKECDC_METRICS_INSTANCE")
                    .is_some_and(|i| !i.is_empty()
                        && i.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "._-:".contains(c))),
                "{origin}: LAKECDC_METRICS_INSTANCE must be a fixed label value: {:?}",
                env.get("LAKECDC_METRICS_INSTANCE")
            );
            // The image's entrypoint is the binary; a `command` must name it.
            let mut args: Vec<String> = Vec::new();
            if let Some(command) = c["command"].as_array() {
                let (bin, rest) = command.split_first().unwrap();
                assert!(str_of(bin, "command").ends_with("lakecdc"), "{origin}");
                args.extend(rest.iter().map(|a| str_of(a, "command").to_string()));
            }
            args.extend(
                c["args"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| str_of(a, "args").to_string()),
            );
            checked.insert(assert_accepted(&origin, &args, env, &paths));
        }
    }
    assert_eq!(
        checked,
        BTreeSet::from(["compact".into(), "flush".into(), "gc".into(), "init".into()])
    );
}

/// `KEY=value` lines of a systemd unit or environment file (comments and sections dropped).
fn unit_lines(path: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(['#', ';', '[']))
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("{}: not KEY=value: {l}", path.display()));
            (k.trim().to_string(), v.trim().to_string())
        })
        .collect()
}

#[test]
fn systemd_command_lines_are_accepted_by_the_binary() {
    let dir = manifests_dir().join("systemd");
    let units = files_with(&dir, &[".service"]);
    let mut checked = BTreeSet::new();
    for unit in &units {
        let origin = unit.display().to_string();
        let timer = unit.with_extension("timer");
        assert!(timer.is_file(), "{origin} has no timer");
        assert!(
            unit_lines(&timer).iter().any(|(k, _)| k == "OnCalendar"),
            "{}",
            timer.display()
        );
        let lines = unit_lines(unit);
        let scratch = tempfile::tempdir().unwrap();
        // The example schemas stand for the installed schema directory.
        let mut paths: PathMap = vec![("/etc/lakecdc/schemas".into(), harness::examples_dir())];
        let mut env = BTreeMap::new();
        let mut exec = Vec::new();
        let mut writable = Vec::new();
        for (k, v) in &lines {
            match k.as_str() {
                "EnvironmentFile" => {
                    assert_eq!(v.trim_start_matches('-'), "/etc/lakecdc/lakecdc.env");
                    for (k, v) in unit_lines(&dir.join("lakecdc.env.example")) {
                        env.insert(k, v);
                    }
                }
                "Environment" => {
                    assert!(!v.contains(['"', '\'', ' ']), "{origin}: keep {v} simple");
                    let (k, v) = v.split_once('=').unwrap();
                    env.insert(k.to_string(), v.to_string());
                }
                "CacheDirectory" | "StateDirectory" => {
                    let root = if k == "CacheDirectory" {
                        "/var/cache"
                    } else {
                        "/var/lib"
                    };
                    let local = scratch.path().join(v.replace('/', "_"));
                    std::fs::create_dir(&local).unwrap();
                    paths.push((format!("{root}/{v}"), local));
                }
                "ReadWritePaths" => {
                    writable.extend(v.split_whitespace().map(|p| p.trim_start_matches('-')));
                }
                "ExecStart" => exec.push(v.clone()),
                _ => {}
            }
        }
        // The sandbox (ProtectSystem=strict) lets the unit write its work dir and the metrics
        // file's directory; writable paths not created by systemd stand for local directories.
        for w in &writable {
            if !paths.iter().any(|(from, _)| from == w) {
                let local = scratch.path().join(format!("rw{}", w.replace('/', "_")));
                std::fs::create_dir(&local).unwrap();
                paths.push((w.to_string(), local));
            }
        }
        for var in ["LAKECDC_WORK_DIR", "TMPDIR"] {
            if let Some(dir) = env.get(var) {
                assert!(
                    writable.contains(&dir.as_str()),
                    "{origin}: {var}={dir} is not writable"
                );
            }
        }
        let metrics = env.get("LAKECDC_METRICS_FILE").cloned();
        if let Some(file) = &metrics {
            let dir = Path::new(file).parent().unwrap().to_str().unwrap();
            assert!(
                writable.contains(&dir),
                "{origin}: LAKECDC_METRICS_FILE={file}: {dir} is not in ReadWritePaths= {writable:?}"
            );
            assert!(
                file.ends_with(".prom") && file.contains("{job}"),
                "{origin}: {file}"
            );
        }
        assert_eq!(exec.len(), 1, "{origin}: {exec:?}");
        assert!(!exec[0].contains(['"', '\'', '%']), "{origin}: {}", exec[0]);
        let mut words = exec[0]
            .trim_start_matches(['-', '@', '+', '!', ':'])
            .split_whitespace()
            .map(str::to_string);
        assert_eq!(words.next().as_deref(), Some("/usr/local/bin/lakecdc"));
        let args: Vec<String> = words.collect();
        let sub = assert_accepted(&origin, &args, env, &paths);
        // The failed run (PostgreSQL unreachable) left its metrics where the collector reads.
        if let Some(file) = &metrics {
            let local = map_path(&file.replace("{job}", &sub), &paths);
            let text = std::fs::read_to_string(&local)
                .unwrap_or_else(|e| panic!("{origin}: no metrics file {local}: {e}"));
            assert!(
                text.contains(&format!("lakecdc_run_exit_code{{command=\"{sub}\"}} 1")),
                "{origin}: {local}:\n{text}"
            );
        }
        checked.insert(sub);
    }
    assert_eq!(
        checked,
        BTreeSet::from(["compact".into(), "flush".into(), "gc".into()])
    );
}

#[test]
fn the_schema_config_map_holds_the_example_schemas() {
    let file = manifests_dir().join("kubernetes/configmap-schemas.yaml");
    let doc = &load_yaml(&file)[0];
    let data = doc["data"].as_object().unwrap();
    let mut names = Vec::new();
    for entry in std::fs::read_dir(harness::examples_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let want = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            data.get(&name).and_then(Value::as_str),
            Some(want.as_str()),
            "{name}"
        );
        names.push(name);
    }
    assert_eq!(data.len(), names.len(), "{:?}", data.keys());
}

#[test]
fn the_deployment_readme_names_every_environment_variable() {
    let readme = std::fs::read_to_string(manifests_dir().join("README.md")).unwrap();
    let mut vars = BTreeSet::new();
    for sub in [
        "flush", "compact", "gc", "verify", "inspect", "init", "init-db", "view", "requeue",
        "doctor", "attach", "detach",
    ] {
        let out = harness::bin().args([sub, "--help"]).output().unwrap();
        assert!(out.status.success(), "{sub} --help");
        let help = String::from_utf8_lossy(&out.stdout).into_owned();
        for part in help.split("[env: ").skip(1) {
            let var: String = part
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            vars.insert(var);
        }
    }
    assert!(vars.len() > 20, "{vars:?}");
    for var in vars {
        assert!(
            readme.contains(&format!("`{var}`")),
            "manifests/README.md does not name {var}"
        );
    }
}

/// The metrics lakecdc exports, with the labels their samples may carry. Mirrors
/// docs/operations.md ("Metrics"): a metric renamed there must be renamed here and in
/// `manifests/alerts/lakecdc-rules.yaml`.
const METRICS: &[&str] = &[
    "lakecdc_last_run_timestamp_seconds",
    "lakecdc_last_success_timestamp_seconds",
    "lakecdc_run_duration_seconds",
    "lakecdc_run_exit_code",
    "lakecdc_run_outcome",
    "lakecdc_schema_rows_exported",
    "lakecdc_schema_files_written",
    "lakecdc_schema_bytes_written",
    "lakecdc_schema_failed",
    "lakecdc_dirty_rows",
    "lakecdc_oldest_dirty_age_seconds",
    "lakecdc_lake_files",
    "lakecdc_lake_bytes",
    "lakecdc_manifest_version",
    "lakecdc_verify_divergences",
];

/// Labels of those samples: lakecdc's own, and `job` / `instance` from the Pushgateway or the
/// scrape.
const METRIC_LABELS: &[&str] = &[
    "command",
    "schema",
    "schema_id",
    "tier",
    "outcome",
    "job",
    "instance",
];

/// The commands that publish metrics (the `command` label's values).
const METRIC_COMMANDS: &[&str] = &["flush", "compact", "gc", "init", "verify"];

/// `lakecdc_*` names in a PromQL expression.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("lakecdc_") {
        let boundary = rest[..i]
            .chars()
            .last()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if boundary {
            names.insert(name.clone());
        }
        rest = &rest[i + name.len()..];
    }
    names
}

/// `(label, operator, value)` of every `{…}` matcher in a PromQL expression.
fn matchers(expr: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for block in expr.split('{').skip(1) {
        let inner = block.split('}').next().unwrap_or_default();
        for m in inner.split(',').map(str::trim).filter(|m| !m.is_empty()) {
            let at = m
                .find(['=', '!'])
                .unwrap_or_else(|| panic!("matcher {m:?}"));
            let (label, rest) = m.split_at(at);
            let op: String = rest.chars().take_while(|c| "=!~".contains(*c)).collect();
            let value = rest[op.len()..].trim().trim_matches('"').to_string();
            out.push((label.trim().to_string(), op, value));
        }
    }
    out
}

#[test]
fn the_alert_rules_use_only_lakecdc_metrics() {
    let file = alerts_dir().join("lakecdc-rules.yaml");
    let docs = load_yaml(&file);
    assert_eq!(docs.len(), 1, "{}: one document", file.display());
    let groups = docs[0]["groups"]
        .as_array()
        .unwrap_or_else(|| panic!("{}: no groups:", file.display()));
    let mut alerts = BTreeSet::new();
    let mut used = BTreeSet::new();
    let mut absent = 0;
    for g in groups {
        assert!(g["name"].is_string(), "group without a name: {g}");
        for r in g["rules"].as_array().unwrap() {
            let name = str_of(&r["alert"], "alert").to_string();
            assert!(
                alerts.insert(name.clone()),
                "{name}: two rules of that name"
            );
            let expr = str_of(&r["expr"], "expr");
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{name}: no lakecdc metric in {expr}");
            for m in &names {
                assert!(
                    METRICS.contains(&m.as_str()),
                    "{name}: unknown metric {m} in {expr}"
                );
            }
            for (label, op, value) in matchers(expr) {
                assert!(
                    METRIC_LABELS.contains(&label.as_str()),
                    "{name}: label {label} in {expr}"
                );
                assert!(
                    ["=", "!=", "=~", "!~"].contains(&op.as_str()),
                    "{name}: {expr}"
                );
                if label == "command" {
                    for v in value.split('|') {
                        assert!(
                            METRIC_COMMANDS.contains(&v),
                            "{name}: command {v:?} in {expr}"
                        );
                    }
                }
            }
            absent += usize::from(expr.contains("absent("));
            used.extend(names);
            // A duration such as 5m / 1h, severity and advice.
            let r#for = str_of(&r["for"], "for");
            assert!(
                r#for.len() > 1
                    && r#for[..r#for.len() - 1].chars().all(|c| c.is_ascii_digit())
                    && r#for.ends_with(['s', 'm', 'h', 'd']),
                "{name}: for: {for}"
            );
            let severity = str_of(&r["labels"]["severity"], "severity");
            assert!(
                ["critical", "warning"].contains(&severity),
                "{name}: {severity}"
            );
            for a in ["summary", "description"] {
                let text = str_of(&r["annotations"][a], a);
                assert!(text.len() > 20, "{name}: {a} too short");
                for part in text.split("$labels.").skip(1) {
                    let label: String = part
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    assert!(
                        METRIC_LABELS.contains(&label.as_str()),
                        "{name}: $labels.{label}"
                    );
                }
            }
        }
    }
    assert!(absent > 0, "no rule notices missing metrics (absent(...))");
    for m in [
        "lakecdc_last_success_timestamp_seconds",
        "lakecdc_run_exit_code",
        "lakecdc_oldest_dirty_age_seconds",
        "lakecdc_verify_divergences",
    ] {
        assert!(used.contains(m), "no rule watches {m}");
    }
}

/// The Dockerfile's instructions: comments dropped, continuation lines joined; each as
/// (keyword in upper case, the rest).
fn dockerfile() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile");
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    let mut line = String::new();
    for l in text.lines() {
        if l.trim_start().starts_with('#') {
            continue;
        }
        match l.trim_end().strip_suffix('\\') {
            Some(head) => line.push_str(head),
            None => {
                line.push_str(l);
                let ins = std::mem::take(&mut line);
                let ins = ins.trim();
                if let Some((k, rest)) = ins.split_once(char::is_whitespace) {
                    out.push((k.to_ascii_uppercase(), rest.trim().to_string()));
                }
            }
        }
    }
    out
}

/// A stage of the Dockerfile: its base image, its name and its instructions.
struct Stage {
    image: String,
    name: String,
    ins: Vec<(String, String)>,
}

impl Stage {
    /// The arguments of every instruction `keyword` of the stage.
    fn of(&self, keyword: &str) -> Vec<String> {
        (self.ins.iter())
            .filter(|(k, _)| k == keyword)
            .map(|(_, rest)| rest.clone())
            .collect()
    }
}

#[test]
fn the_dockerfile_agrees_with_the_toolchain_and_the_pods() {
    let mut stages: Vec<Stage> = Vec::new();
    for (k, rest) in dockerfile() {
        if k == "FROM" {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let name = match words.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => name.to_string(),
                [_] => stages.len().to_string(),
                other => panic!("FROM {other:?}"),
            };
            stages.push(Stage {
                image: words[0].to_string(),
                name,
                ins: Vec::new(),
            });
        } else {
            stages
                .last_mut()
                .expect("an instruction before FROM")
                .ins
                .push((k, rest));
        }
    }
    assert!(stages.len() >= 2, "a builder and a runtime stage");

    // The builder: the toolchain of rust-toolchain.toml, building the release binary.
    let toolchain: toml::Table =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("rust-toolchain.toml"))
            .unwrap()
            .parse()
            .unwrap();
    let channel = toolchain["toolchain"]["channel"].as_str().unwrap();
    let builder = stages
        .iter()
        .find(|s| s.image.starts_with("rust:"))
        .expect("a builder stage FROM rust:<version>");
    let version = builder.image["rust:".len()..].split('-').next().unwrap();
    assert_eq!(
        version, channel,
        "the builder image {} and rust-toolchain.toml disagree",
        builder.image
    );
    assert!(
        builder
            .of("RUN")
            .iter()
            .any(|r| r.contains("cargo build --release --locked --bin lakecdc")),
        "the builder does not build the release binary"
    );

    // The runtime: the binary as entrypoint, run as the pods' user.
    let runtime = stages.last().unwrap();
    let copies = runtime.of("COPY");
    let from = format!("--from={} ", builder.name);
    assert!(
        copies.iter().any(|c| c.starts_with(&from)
            && c.ends_with(" /usr/local/bin/lakecdc")
            && c.contains("/release/lakecdc ")),
        "the runtime stage does not copy the built binary to /usr/local/bin/lakecdc: {copies:?}"
    );
    let entrypoint: Value = serde_json::from_str(&runtime.of("ENTRYPOINT").pop().unwrap()).unwrap();
    assert_eq!(entrypoint, json!(["/usr/local/bin/lakecdc"]));
    let user = runtime
        .of("USER")
        .pop()
        .expect("a USER in the runtime stage");
    let (uid, gid) = user.split_once(':').expect("USER uid:gid");
    let (uid, gid): (i64, i64) = (uid.parse().unwrap(), gid.parse().unwrap());
    assert_ne!(uid, 0, "the image runs as root");
    assert_eq!((uid, gid), (65532, 65532), "distroless's nonroot user");
    let docs = kubernetes_docs();
    let pods = pod_specs(&docs);
    assert!(!pods.is_empty());
    for (file, owner, pod) in &pods {
        let sc = &pod["securityContext"];
        assert_eq!(
            sc["runAsNonRoot"],
            json!(true),
            "{} {owner}",
            file.display()
        );
        assert_eq!(
            (sc["runAsUser"].as_i64(), sc["runAsGroup"].as_i64()),
            (Some(uid), Some(gid)),
            "{} {owner}: the securityContext and the Dockerfile's USER {user} disagree",
            file.display()
        );
    }
    // The default command works as given.
    let cmd: Vec<String> = serde_json::from_str(&runtime.of("CMD").pop().expect("a CMD")).unwrap();
    let out = harness::bin().args(&cmd).output().unwrap();
    assert!(
        out.status.success(),
        "CMD {cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn schema_validator() -> Validator {
    let schema: Value = serde_json::from_slice(
        &std::fs::read(manifests_dir().join("lake-manifest.schema.json")).unwrap(),
    )
    .unwrap();
    jsonschema::draft202012::meta::validate(&schema)
        .unwrap_or_else(|e| panic!("lake-manifest.schema.json is not a valid schema: {e}"));
    jsonschema::draft202012::new(&schema).unwrap()
}

/// The instance paths of every validation error (empty when valid).
fn errors(v: &Validator, doc: &Value) -> Vec<String> {
    v.iter_errors(doc)
        .map(|e| format!("{}: {e}", e.instance_path().as_str()))
        .collect()
}

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/manifest")
        .join(name);
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn compact_ctx(rig: &Rig) -> Context {
    Context {
        shutdown: Default::default(),
        ..rig.ctx.clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn manifests_written_by_lakecdc_validate_against_the_schema() {
    const MANIFEST: &str = "manifest/100.json";
    let v = schema_validator();
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(2020);
    let compact = |rig: &Rig, o: CompactOptions| {
        let ctx = compact_ctx(rig);
        async move {
            let report = lakecdc::compact::run(&ctx, &o).await.unwrap();
            report.schemas.into_iter().next().unwrap()
        }
    };
    let opts = |rig: &Rig| CompactOptions {
        schemas: vec!["customer".into()],
        work_dir: rig.opts.work_dir.clone(),
        ..CompactOptions::default()
    };
    let mut tiers = BTreeSet::new();
    let mut check = async |rig: &Rig, stage: &str| -> Value {
        let m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
            .await
            .unwrap();
        assert_eq!(errors(&v, &m), Vec::<String>::new(), "{stage}: {m:#}");
        for f in m["files"].as_array().unwrap() {
            tiers.insert(f["tier"].as_str().unwrap().to_string());
        }
        m
    };

    // Deltas of a flush.
    rig.seed(120, &mut r).await;
    rig.flush().await;
    let m = check(&rig, "after a flush").await;
    assert!(!m["files"].as_array().unwrap().is_empty());
    // The deltas promoted to base, then new deltas over it.
    let promote = CompactOptions {
        max_deltas: 0,
        ..opts(&rig)
    };
    let s = compact(&rig, promote).await;
    assert_eq!(s.plan.as_ref().unwrap().decision, Decision::Promote);
    check(&rig, "after a promotion").await;
    for _ in 0..60 {
        rig.writer.random_op(&mut r).await;
    }
    let id = *rig.writer.rows.keys().next().unwrap();
    rig.writer.hard_delete(id).await;
    rig.flush().await;
    check(&rig, "base and deltas").await;
    // A rewrite: one merged base, and the sources recorded under `retired`.
    let s = compact(&rig, opts(&rig)).await;
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    assert_eq!(s.plan.as_ref().unwrap().decision, Decision::Rewrite);
    let m = check(&rig, "after a rewrite").await;
    assert!(!m["retired"].as_array().unwrap().is_empty(), "{m:#}");
    assert_eq!(tiers, BTreeSet::from(["base".into(), "delta".into()]));
}

#[test]
fn the_schema_accepts_the_forma_fixture_as_lakecdc_rewrites_it() {
    let v = schema_validator();
    // lakecdc's rewrite of a forma manifest: an entry without checksum, empty row_id bounds,
    // unknown fields at both levels (`writer`, `level`).
    let rewritten = fixture("forma.rewritten.json");
    assert_eq!(errors(&v, &rewritten), Vec::<String>::new());
    // forma's own file spells one tier "Delta": readers accept it, but the schema documents
    // what lakecdc writes (lowercase), and lakecdc lowercases it on rewrite.
    let errs = errors(&v, &fixture("forma.json"));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].starts_with("/files/1/tier:"), "{errs:?}");
}

#[test]
fn the_schema_rejects_what_lakecdc_never_writes() {
    let v = schema_validator();
    let good = fixture("forma.rewritten.json");
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit); 11] = [
        ("/files/0/checksum", |m| {
            m["files"][0]["checksum"] = json!("md5:9e107d9d372bb6826bd81d3542a419d6");
        }),
        ("/files/0/checksum", |m| {
            m["files"][0]["checksum"] = json!("sha256:ABCDEF");
        }),
        ("/files/1/tier", |m| {
            m["files"][1]["tier"] = json!("archive")
        }),
        ("/files/0/tier", |m| m["files"][0]["tier"] = json!("BASE")),
        ("/files/0/row_id_min", |m| {
            m["files"][0]["row_id_min"] = json!("0190A1B2-0000-7000-8000-000000000001");
        }),
        ("/files/0/path", |m| m["files"][0]["path"] = json!("")),
        ("/files/0/row_count", |m| {
            m["files"][0]["row_count"] = json!(-1)
        }),
        ("/files/2", |m| {
            m["files"][2].as_object_mut().unwrap().remove("size_bytes");
        }),
        ("/schema_id", |m| m["schema_id"] = json!(0)),
        ("", |m| {
            m.as_object_mut().unwrap().remove("files");
        }),
        ("/retired/0/retired_at_ms", |m| {
            m["retired"] = json!([{"path": "data/7/x.parquet", "retired_at_ms": "yesterday"}]);
        }),
    ];
    for (at, edit) in cases {
        let mut m = good.clone();
        edit(&mut m);
        let errs = errors(&v, &m);
        assert!(
            errs.iter().any(|e| e.starts_with(&format!("{at}:"))),
            "expected an error at {at:?}, got {errs:?}"
        );
    }
    // What the schema allows: fields it does not describe, and a well-formed `retired`.
    let mut m = good;
    m["compactor"] = json!({"note": "kept verbatim"});
    m["files"][0]["level"] = json!(3);
    m["retired"] = json!([{"path": "data/7/x.parquet", "retired_at_ms": 1732860000999_i64}]);
    assert_eq!(errors(&v, &m), Vec::<String>::new());
}
