//! A registry row whose name is not a plain file name (`../evil/pwn`, `/abs/path`, `sub/x`, a
//! control character) fails the job with one line naming the row's id and the rule, the name
//! escaped, before any metadata file is opened: a metadata file planted where the name leads
//! is never read (its content would be a JSON error), and nothing is written anywhere
//! (docs/hazards.md S6).

use crate::support::harness;
use crate::support::rig::{LakeKind, rig};

/// What a planted file holds: not JSON, so reading it would be an "invalid JSON" error.
const PLANTED: &str = "planted: outside the schema directory";

#[tokio::test]
async fn a_registry_name_that_leaves_the_schema_dir_fails_the_job_and_reads_nothing() {
    let mut rig = rig(LakeKind::Local).await;
    assert!(rig.change_log().await.is_empty());
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("schemas");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    for f in std::fs::read_dir(harness::examples_dir()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    std::fs::create_dir_all(root.path().join("evil")).unwrap();
    let abs = root.path().join("abs");
    std::fs::create_dir_all(&abs).unwrap();
    // (registry name, where an unchecked name would read, how the error shows the name)
    let abs_name = abs.join("pwn").display().to_string();
    let cases = [
        (
            "../evil/pwn".to_string(),
            Some(root.path().join("evil/pwn_attributes.json")),
            "\"../evil/pwn\"".to_string(),
        ),
        (
            abs_name.clone(),
            Some(abs.join("pwn_attributes.json")),
            format!("\"{abs_name}\""),
        ),
        (
            "sub/x".to_string(),
            Some(dir.join("sub/x_attributes.json")),
            "\"sub/x\"".to_string(),
        ),
        (
            "cust\u{1b}[31mred\u{7}".to_string(),
            None,
            r#""cust\x1b[31mred\x07""#.to_string(),
        ),
    ];
    rig.ctx.schema_dir = Some(dir.clone());
    for (name, planted, shown) in &cases {
        if let Some(p) = planted {
            std::fs::write(p, PLANTED).unwrap();
        }
        // The hostile schema is registered and has a row to flush, so a job would load it.
        rig.writer
            .client
            .batch_execute(
                "DELETE FROM change_log WHERE schema_id = 200; DELETE FROM schema_registry WHERE schema_id = 200",
            )
            .await
            .unwrap();
        rig.writer
            .client
            .execute(
                "INSERT INTO schema_registry (schema_name, schema_id) VALUES ($1, 200)",
                &[name],
            )
            .await
            .unwrap();
        rig.writer
            .client
            .execute(
                "INSERT INTO change_log (schema_id, row_id, changed_at) VALUES (200, gen_random_uuid(), 5)",
                &[],
            )
            .await
            .unwrap();
        let err = lakecdc::flush::run(&rig.ctx, &rig.opts).await.unwrap_err();
        let line = err.chain();
        assert!(
            matches!(err, lakecdc::Error::Decode { .. }),
            "{name:?}: {err:?}"
        );
        assert!(
            line.contains(&format!(
                "schema_id 200 in \"schema_registry\": {shown} is not a valid schema name"
            )),
            "{name:?}: {line}"
        );
        assert!(
            !line.contains("JSON") && !line.contains("planted"),
            "{line}"
        );
        assert!(!line.chars().any(char::is_control), "{line:?}");
        assert!(rig.store.calls().is_empty(), "{:?}", rig.store.calls());
        // The other jobs load the registry the same way.
        let err = lakecdc::job::select_schemas(&rig.job_context(), &[])
            .await
            .unwrap_err();
        assert!(
            err.chain().contains("is not a valid schema name"),
            "{}",
            err.chain()
        );
    }
    let marked: i64 = rig
        .writer
        .client
        .query_one("SELECT count(*) FROM change_log WHERE flushed_at <> 0", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(marked, 0, "no row was marked");

    // The binary: exit 1, one line on stderr, the planted file not read.
    let lake = root.path().join("lake");
    std::fs::create_dir_all(&lake).unwrap();
    let out = harness::bin()
        .args(["flush", "--pg-url", &rig.db.url, "--lake"])
        .arg(&lake)
        .arg("--schema-dir")
        .arg(&dir)
        .env_remove("LAKECDC_PG_URL")
        .env_remove("DATABASE_URL")
        .env_remove("LAKECDC_LOG")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("lakecdc: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("schema_id 200") && errors[0].contains("is not a valid schema name"),
        "{stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}') && !stderr.contains(PLANTED),
        "{stderr:?}"
    );
}
