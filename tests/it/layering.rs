//! The library's dependency rules, checked on its source (docs/design.md §1): jobs never import
//! jobs; the building blocks (source, engine, lake, store) never import each other, except that
//! lake commits through store; and no two modules depend on each other, directly or around a
//! cycle — at the level of the crate's top modules and of the files inside each.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const JOBS: [&str; 11] = [
    "flush", "init", "compact", "gc", "verify", "inspect", "init_db", "view", "requeue", "doctor",
    "attach",
];
const BLOCKS: [&str; 4] = ["source", "engine", "lake", "store"];

/// Module path (`["source", "snapshot"]`) → the module paths it names (`crate::…`, `super::…`).
type Graph = BTreeMap<Vec<String>, BTreeSet<Vec<String>>>;

fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The code of a file without its comments and its `#[cfg(test)]` module (tests may reach
/// anywhere).
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `crate::a::b` and `super::a` path in `text`, resolved from `module`.
fn references(module: &[String], text: &str) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    let words: Vec<char> = text.chars().collect();
    let s: String = words.iter().collect();
    for (start, prefix) in [("crate::", 0usize), ("super::", 1usize)] {
        for (i, _) in s.match_indices(start) {
            let before = s[..i].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let rest = &s[i + start.len()..];
            let path: Vec<String> = rest
                .split("::")
                .map_while(|seg| {
                    let ident: String = seg
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    (!ident.is_empty() && ident.chars().next().is_some_and(char::is_lowercase))
                        .then_some(ident)
                })
                .collect();
            let base: Vec<String> = if prefix == 0 {
                Vec::new()
            } else {
                module[..module.len().saturating_sub(1)].to_vec()
            };
            let mut full = base;
            full.extend(path);
            if !full.is_empty() {
                out.insert(full);
            }
        }
    }
    out
}

/// Every `.rs` file under `roots`, at any depth.
fn rust_files(roots: &[std::path::PathBuf]) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut dirs = roots.to_vec();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = rust_files(std::slice::from_ref(&src));
    let modules: BTreeSet<Vec<String>> = files
        .iter()
        .map(|f| module_of(f.strip_prefix(&src).unwrap()))
        .collect();
    let mut graph = Graph::new();
    for f in &files {
        let module = module_of(f.strip_prefix(&src).unwrap());
        let text = code(&std::fs::read_to_string(f).unwrap());
        let deps = references(&module, &text)
            .into_iter()
            // The longest prefix that is a module (the rest names an item in it).
            .filter_map(|p| {
                (1..=p.len())
                    .rev()
                    .map(|n| p[..n].to_vec())
                    .find(|m| modules.contains(m))
            })
            .filter(|m| *m != module)
            .collect();
        graph.insert(module, deps);
    }
    graph
}

/// The graph with every module folded into its ancestor of `depth` parts (its own path when
/// shorter), keeping only edges between modules under `within`.
fn folded(g: &Graph, within: &[String], depth: usize) -> BTreeMap<String, BTreeSet<String>> {
    let fold = |m: &Vec<String>| -> Option<String> {
        m.starts_with(within)
            .then(|| m[..m.len().min(depth)].join("::"))
            .filter(|s| !s.is_empty())
    };
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, deps) in g {
        let Some(a) = fold(from) else { continue };
        for to in deps {
            if let Some(b) = fold(to).filter(|b| *b != a) {
                out.entry(a.clone()).or_default().insert(b);
            }
        }
    }
    out
}

fn cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        n: &str,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut c = stack[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(g, m, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|n| visit(g, n, &mut Vec::new(), &mut done))
}

#[test]
fn dependencies_point_one_way_and_never_around_a_cycle() {
    let g = graph();
    assert!(g.len() > 40, "only {} modules found", g.len());
    let top = folded(&g, &[], 1);
    let mut edges = 0;
    for (from, deps) in &top {
        for to in deps {
            edges += 1;
            let (a, b) = (from.as_str(), to.as_str());
            assert!(
                !(JOBS.contains(&a) && JOBS.contains(&b)),
                "job {a} imports job {b}"
            );
            assert!(
                !(BLOCKS.contains(&a) && BLOCKS.contains(&b)) || (a, b) == ("lake", "store"),
                "building block {a} imports building block {b}"
            );
        }
    }
    assert!(edges > 40, "only {edges} dependencies found");
    assert_eq!(cycle(&top), None, "a cycle between the crate's modules");
    // Inside each module with files of its own.
    let parents: BTreeSet<Vec<String>> = g
        .keys()
        .filter(|m| m.len() == 2)
        .map(|m| m[..1].to_vec())
        .collect();
    for parent in parents {
        let inner = folded(&g, &parent, 2);
        assert_eq!(cycle(&inner), None, "a cycle inside {}", parent.join("::"));
    }
}

#[test]
fn the_checker_sees_a_planted_cycle_and_a_job_importing_a_job() {
    let m = |s: &str| s.split("::").map(str::to_string).collect::<Vec<_>>();
    let refs = references(
        &m("engine::writer"),
        "use super::export::Plan; crate::source::x();",
    );
    assert_eq!(refs, [m("engine::export"), m("source::x")].into());
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), ["b".to_string()].into()),
        ("b".to_string(), ["a".to_string()].into()),
    ]
    .into();
    assert!(cycle(&g).is_some());
}

/// The test seams (docs/security.md) are compiled only for tests: each is declared right under
/// a `cfg` naming the `testing` feature (or `test`), and no default feature turns it on.
#[test]
fn test_seams_exist_only_with_the_testing_feature() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let seams = [
        ("src/store/mod.rs", "pub mod fault;"),
        ("src/store/mod.rs", "pub mod memory;"),
        ("src/flush.rs", "pub async fn run_with_hooks("),
        ("src/compact.rs", "pub async fn run_with_hook("),
        ("src/gc/mod.rs", "pub async fn run_with_hook("),
        ("src/init.rs", "pub after_page: Option<PageHook>,"),
        ("src/source/connect.rs", "fn password_for_tests("),
    ];
    for (file, item) in seams {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.trim_start().starts_with(item))
            .unwrap_or_else(|| panic!("{file}: {item} not found"));
        let gate = lines[at - 1].trim();
        assert!(
            gate == "#[cfg(any(test, feature = \"testing\"))]" || gate == "#[cfg(test)]",
            "{file}: {item} is not gated by the testing feature (line above: {gate})"
        );
    }
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let default = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("default ="))
        .unwrap_or_default();
    assert!(
        !default.contains("testing"),
        "the testing feature is a default"
    );
}

/// lakecdc's only `unsafe` code is glibc's `mallopt` in `src/allocator.rs` (docs/security.md):
/// the crate denies `unsafe_code`, and no other file of the crate or the binary allows (or
/// expects) it or has an `unsafe` block.
#[test]
fn unsafe_code_is_allowed_in_the_allocator_settings_only() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains("unsafe_code = \"deny\""),
        "Cargo.toml no longer denies unsafe_code"
    );
    let files = rust_files(&[root.join("src"), root.join("cmd")]);
    assert!(files.len() > 100, "only {} source files found", files.len());
    let mut allowing = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        // `allow` and `expect` both lift the crate's `deny`.
        if ["allow(unsafe_code)", "expect(unsafe_code)", "unsafe {"]
            .iter()
            .any(|p| text.contains(p))
        {
            allowing.push(path.strip_prefix(root).unwrap().display().to_string());
        }
    }
    assert_eq!(allowing, ["src/allocator.rs"]);
}
