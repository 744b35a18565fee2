//! Configuration errors: exit 2, one line naming the setting, before any connection.

use crate::support::harness;

/// An address where a connection attempt would fail with exit 1, not 2.
const UNREACHABLE: &str = "host=127.0.0.1 port=1 user=u dbname=d sslmode=disable connect_timeout=1";

fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = harness::bin();
    cmd.args(args)
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// (arguments, environment, text the error must contain)
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

#[test]
fn invalid_configuration_exits_2_with_one_line() {
    let cases: [Case; 14] = [
        (&["init-db", "--data-prefix", "/abs"], &[], "--data-prefix"),
        (
            &["init-db", "--manifest-template", "manifest/all.json"],
            &[],
            "--manifest-template",
        ),
        (&["init-db", "--lake", "gs://bucket/x"], &[], "--lake"),
        (
            &["init-db", "--lake", "s3://Bad_Bucket"],
            &[],
            "not a valid S3 bucket",
        ),
        (
            &["init-db", "--change-log-table", "change-log"],
            &[],
            "--change-log-table",
        ),
        (
            &["init-db", "--lake", "s3://bucket-ok/root"],
            &[("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")],
            "AWS_SECRET_ACCESS_KEY",
        ),
        (
            &["init-db", "--schema-dir", "/nonexistent/dir"],
            &[],
            "--schema-dir",
        ),
        (
            &["verify", "--lock-wait", "soon"],
            &[],
            "--lock-wait \"soon\" is not a duration",
        ),
        // Zero or absurd values that would write a file per row, never rewrite, or export
        // nothing while reporting success (docs/hazards.md L103).
        (
            &["compact", "--target-base-size", "0"],
            &[],
            "--target-base-size must be at least 4KiB",
        ),
        (
            &["init", "--max-file-rows", "0"],
            &[],
            "--max-file-rows must be at least 1",
        ),
        (
            &["flush", "--max-batches", "0"],
            &[],
            "--max-batches must be at least 1 (leave it unset for no limit)",
        ),
        (
            &["compact", "--dirty-ratio", "150%"],
            &[],
            "--dirty-ratio must be at most 100%",
        ),
        (
            &["init", "--readers", "0"],
            &[],
            "--readers must be at least 1",
        ),
        (
            &["verify", "--parallelism", "0"],
            &[],
            "--parallelism must be at least 1",
        ),
    ];
    for (args, env, needle) in cases {
        let mut full = args.to_vec();
        full.extend(["--pg-url", UNREACHABLE]);
        let (code, stderr) = run(&full, env);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn a_password_in_a_flag_is_refused_without_showing_it() {
    // Any user of the host can read a command line: secrets come from the environment.
    for dsn in [
        "postgres://u:s3cr3t-pw@127.0.0.1:1/d",
        "host=127.0.0.1 port=1 user=u password=s3cr3t-pw dbname=d",
    ] {
        let (code, stderr) = run(&["flush", "--pg-url", dsn], &[]);
        assert_eq!(code, Some(2), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.contains("LAKECDC_PG_URL"), "{stderr}");
        assert!(!stderr.contains("s3cr3t"), "{stderr}");
    }
    // The same string from the environment is taken (and fails only to connect).
    let (code, stderr) = run(
        &["init-db"],
        &[(
            "LAKECDC_PG_URL",
            "postgres://u:s3cr3t-pw@127.0.0.1:1/d?connect_timeout=1",
        )],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(!stderr.contains("s3cr3t"), "{stderr}");
}

#[test]
fn a_config_file_sits_below_flags_and_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lakecdc.toml");
    // A password may live in the file (it is not a command line); gc's own table sets its
    // grace too short, which gc refuses before connecting.
    std::fs::write(
        &file,
        format!(
            "pg-url = \"{}\"\nlake = \"{}\"\n[gc]\ngrace = \"1m\"\n",
            "host=127.0.0.1 port=1 user=u password=s3cr3t-pw dbname=d sslmode=disable connect_timeout=1",
            dir.path().display()
        ),
    )
    .unwrap();
    let config = file.to_str().unwrap();
    let (code, stderr) = run(&["gc", "--config", config], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--grace must be at least"), "{stderr}");
    // The environment wins over the file, and a flag over the environment: with a valid grace
    // gc goes on to connect (the file's DSN, unreachable: exit 1, the password not shown).
    for (args, env) in [
        (
            vec!["gc"],
            vec![("LAKECDC_CONFIG", config), ("LAKECDC_GC_GRACE", "2h")],
        ),
        (
            vec!["gc", "--grace", "2h"],
            vec![("LAKECDC_CONFIG", config), ("LAKECDC_GC_GRACE", "1m")],
        ),
    ] {
        let (code, stderr) = run(&args, &env);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("connect to u@127.0.0.1:1/d"), "{stderr}");
        assert!(!stderr.contains("s3cr3t"), "{stderr}");
    }
    // A password in the file is never shown, not even as a flag's default in --help.
    let (code, help) = {
        let out = harness::bin()
            .args(["gc", "--help"])
            .env("LAKECDC_CONFIG", config)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    assert_eq!(code, Some(0));
    assert!(
        help.contains("--pg-url") && !help.contains("s3cr3t"),
        "{help}"
    );
    // DATABASE_URL (the environment) beats the file's pg-url.
    let (code, stderr) = run(
        &["gc", "--grace", "2h"],
        &[
            ("LAKECDC_CONFIG", config),
            (
                "DATABASE_URL",
                "host=127.0.0.1 port=2 user=fromenv dbname=d sslmode=disable connect_timeout=1",
            ),
        ],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("connect to fromenv@127.0.0.1:2/d"),
        "{stderr}"
    );
    // inspect judges with flush's and compact's settings, unless its own table says otherwise.
    let thresholds = dir.path().join("thresholds.toml");
    for (text, want) in [
        ("[flush]\nmin-records = 5000\n", "[default: 5000]"),
        (
            "[inspect]\nmin-records = 7\n[flush]\nmin-records = 5000\n",
            "[default: 7]",
        ),
    ] {
        std::fs::write(&thresholds, text).unwrap();
        let out = harness::bin()
            .args(["inspect", "--help"])
            .env("LAKECDC_CONFIG", &thresholds)
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        let line = help
            .lines()
            .skip_while(|l| !l.contains("--min-records"))
            .nth(1)
            .unwrap_or_default();
        assert!(line.contains(want), "{text}: {line}");
    }
    // The example file of manifests/ is a valid one for every command.
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/lakecdc.toml");
    for command in [
        "flush", "compact", "gc", "init", "inspect", "verify", "init-db",
    ] {
        let (code, stderr) = run(&[command, "--config", example, "--help"], &[]);
        assert_eq!(code, Some(0), "{command}: {stderr}");
    }
    // A misspelt key, a global flag in a command's table and a table that is no command are
    // errors naming the key, not silently ignored.
    for (text, needle) in [
        ("min-recrods = 5\n", "min-recrods is not a setting"),
        ("[flush]\nlake = \"/tmp/x\"\n", "[flush] lake"),
        ("[flsh]\nmin-records = 5\n", "[flsh] is not a command"),
        ("min-records = \n", "not valid TOML"),
    ] {
        std::fs::write(&file, text).unwrap();
        let (code, stderr) = run(&["flush", "--config", config], &[]);
        assert_eq!(code, Some(2), "{text}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.contains(needle), "{text}: {stderr}");
    }
}

#[test]
fn unreachable_postgres_is_a_runtime_failure() {
    let (code, stderr) = run(&["init-db", "--pg-url", UNREACHABLE], &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("connect to u@127.0.0.1:1/d"), "{stderr}");
}

#[test]
fn help_shows_every_env_fallback() {
    let out = harness::bin().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for var in [
        "LAKECDC_PG_URL",
        "LAKECDC_LAKE",
        "LAKECDC_S3_ENDPOINT",
        "LAKECDC_S3_PATH_STYLE",
        "LAKECDC_S3_REGION",
        "LAKECDC_SCHEMA_DIR",
        "LAKECDC_SCHEMA",
        "LAKECDC_REGISTRY_TABLE",
        "LAKECDC_ENTITY_TABLE",
        "LAKECDC_EAV_TABLE",
        "LAKECDC_CHANGE_LOG_TABLE",
        "LAKECDC_DATA_PREFIX",
        "LAKECDC_MANIFEST_TEMPLATE",
        "LAKECDC_JSON",
        "LAKECDC_LOG_FORMAT",
        "DATABASE_URL",
    ] {
        assert!(help.contains(var), "--help lacks {var}");
    }
}

#[test]
fn the_copy_tap_switch_takes_on_or_off() {
    let (code, stderr) = run(
        &["init-db", "--copy-tap", "maybe", "--pg-url", UNREACHABLE],
        &[],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--copy-tap \"maybe\" is not one of on, off"),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    // Off (from the flag or the environment) is a valid setting: the run goes on to connect.
    for (args, env) in [
        (vec!["init-db", "--copy-tap", "off"], vec![]),
        (vec!["init-db"], vec![("LAKECDC_COPY_TAP", "off")]),
    ] {
        let mut args = args;
        args.extend(["--pg-url", UNREACHABLE]);
        let (code, stderr) = run(&args, &env);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("connect to u@127.0.0.1:1/d"), "{stderr}");
    }
}

#[test]
fn the_maintenance_jobs_wait_a_minute_for_a_held_schema_and_flush_does_not() {
    for (command, env, default) in [
        ("verify", "LAKECDC_LOCK_WAIT", "[default: 1m]"),
        ("gc", "LAKECDC_LOCK_WAIT", "[default: 1m]"),
        ("init", "LAKECDC_LOCK_WAIT", "[default: 1m]"),
        ("flush", "LAKECDC_FLUSH_LOCK_WAIT", "[default: 0s]"),
    ] {
        let out = harness::bin().args([command, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        let line = help
            .lines()
            .skip_while(|l| !l.contains("--lock-wait"))
            .take(4)
            .collect::<Vec<_>>()
            .join(" ");
        assert!(line.contains(&format!("[env: {env}]")), "{command}: {line}");
        assert!(line.contains(default), "{command}: {line}");
    }
}

#[test]
fn a_failed_run_asked_for_json_prints_its_error_as_json() {
    // docs/hazards.md L105: a failing run printed nothing on stdout with --json and a plain
    // line on stderr with --log-format json, so a parser of either lost the one event that
    // mattered.
    for (args, code) in [
        (&["verify", "--lock-wait", "soon"][..], 2),
        (&["inspect"][..], 1),
    ] {
        let out = harness::bin()
            .args(args)
            .args(["--json", "--log-format", "json", "--pg-url", UNREACHABLE])
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{args:?}");
        let stdout: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(stdout["exit_code"], code, "{stdout}");
        assert!(stdout["error"].as_str().unwrap().len() > 10, "{stdout}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().last().unwrap();
        let event: serde_json::Value = serde_json::from_str(last).unwrap();
        assert_eq!(event["level"], "ERROR", "{last}");
        assert_eq!(event["fields"]["exit_code"], code, "{last}");
        let message = event["fields"]["message"].as_str().unwrap();
        assert!(
            message.contains(stdout["error"].as_str().unwrap()),
            "{last}"
        );
    }
    // Without --json, stdout stays empty and the line stays text.
    let out = harness::bin()
        .args(["inspect", "--pg-url", UNREACHABLE])
        .output()
        .unwrap();
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("lakecdc: error: "));
}
