//! The documentation stays true to the code: every test `docs/hazards.md` names as guarding a
//! hazard exists, and every hazard names one unless it says why not (`n/a: …`) or admits it
//! (`NOT GUARDED`).

use std::path::Path;

/// The backticked `file.rs::function` references in `text`, as (file, function).
fn test_refs(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    // Every other piece between backticks is quoted.
    for quoted in text.split('`').skip(1).step_by(2) {
        let Some((file, name)) = quoted.split_once("::") else {
            continue;
        };
        let ident = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if file.ends_with(".rs") && ident {
            out.push((file.to_string(), name.to_string()));
        }
    }
    out
}

#[test]
fn every_hazard_names_a_test_that_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/hazards.md")).expect("docs/hazards.md");
    let mut rows = 0;
    let mut checked = 0;
    let mut problems = Vec::new();
    for line in doc.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        let id = cells.first().copied().unwrap_or_default();
        // The header and separator rows of each table.
        if id == "id" || id.starts_with("---") {
            continue;
        }
        rows += 1;
        let guarded = cells.last().copied().unwrap_or_default();
        let exempt = guarded.starts_with("n/a") || guarded.starts_with("NOT GUARDED");
        let refs = test_refs(line);
        if refs.is_empty() && !exempt {
            problems.push(format!(
                "{id}: names no test, and does not say `n/a: <why>` or `NOT GUARDED`"
            ));
        }
        for (file, name) in refs {
            checked += 1;
            match std::fs::read_to_string(root.join(&file)) {
                Ok(source) if source.contains(&format!("fn {name}(")) => {}
                Ok(_) => problems.push(format!("{id}: {file} has no `fn {name}(`")),
                Err(e) => problems.push(format!("{id}: {file}: {e}")),
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/hazards.md is out of date:\n{}",
        problems.join("\n")
    );
    assert!(
        rows >= 48,
        "only {rows} hazard rows found in docs/hazards.md"
    );
    assert!(
        checked > 30,
        "only {checked} test references found in docs/hazards.md"
    );
}
