//! `lakecdc query`: SQL over the lake's current state, in an in-process DuckDB
//! (docs/design.md §4.8). Each schema the SQL names is a view of its current state (the read
//! rule shared with `view`, [`crate::engine::current_state`]) and `<name>__history` of every
//! listed copy, over one manifest version per schema (loaded once); two schemas that would be
//! one view stop the query. Every file is checked
//! before DuckDB reads it: a local lake's in place (opened without following links, its size
//! compared, and with `--verify` its SHA-256), an S3 lake's through the content-addressed
//! [`cache`]. A query that pins `row_id` reads only the files whose range can hold it
//! ([`prune`]). Nothing in the lake is written, and no lock is taken.

mod cache;
pub mod output;
mod prune;

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use futures::{StreamExt, TryStreamExt, stream};
use serde::Serialize;

use crate::engine::{Engine, EngineConfig, schema_views};
use crate::error::{Error, Result};
use crate::job::{self, Context, catalog};
use crate::lake::history::{self, AsOf};
use crate::lake::manifest::{self, FileEntry, Manifest};
use crate::scratch::Scratch;
use crate::source::registry::Registered;

pub use output::{Destination, Format};

/// Where the SQL comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqlSource {
    /// Given on the command line.
    Text(String),
    /// A file (`-f`).
    File(PathBuf),
    /// Standard input.
    Stdin,
}

/// What `query` runs and where the result goes.
#[derive(Debug, Clone)]
pub struct QueryOptions {
    /// The SQL.
    pub sql: SqlSource,
    /// Schemas by name or id that may be views; empty means all.
    pub schemas: Vec<String>,
    /// The result's format.
    pub format: Format,
    /// Where the result goes.
    pub output: Destination,
    /// Read the state as of this (`VERSION`, RFC 3339, or `-1h`) instead of the newest.
    pub as_of: Option<String>,
    /// Also re-hash cached files before reading them (a local lake's are always hashed).
    pub verify: bool,
    /// The S3 cache's directory.
    pub cache_dir: PathBuf,
    /// The most the cache holds, in bytes.
    pub cache_max: u64,
    /// Downloads at once.
    pub parallelism: usize,
    /// Where the private scratch directory (DuckDB's spill) is made.
    pub work_dir: PathBuf,
    /// DuckDB's settings.
    pub engine: EngineConfig,
}

/// How one schema was read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SchemaRead {
    /// The schema (the view's name).
    pub schema: String,
    /// Its id.
    pub schema_id: i16,
    /// The manifest version read.
    pub version: i64,
    /// Files the manifest lists.
    pub files_listed: usize,
    /// Files the views read (after pruning).
    pub files_read: usize,
    /// Files downloaded from the store for this query.
    pub downloaded: usize,
    /// Bytes downloaded.
    pub downloaded_bytes: u64,
    /// Files found in the cache.
    pub cache_hits: usize,
}

/// What a query did (its rows went to the output).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QueryReport {
    /// Rows written.
    pub rows: u64,
    /// Per schema made a view, by id.
    pub schemas: Vec<SchemaRead>,
    /// Files the cache evicted.
    pub evicted: usize,
}

/// One file a view reads, ready: a path DuckDB opens and whatever keeps it valid.
struct Ready {
    path: String,
    /// A local lake's file, held open so the path (`/proc/self/fd/N`) names the checked file.
    _open: Option<File>,
}

/// Runs the query of `opts` and writes its result.
pub async fn run(ctx: &Context, opts: &QueryOptions) -> Result<QueryReport> {
    let sql = match prune::statements(&read_sql(&opts.sql).await?) {
        prune::Statements::One(sql) | prune::Statements::Unknown(sql) => sql.to_string(),
        prune::Statements::None => {
            return Err(Error::config(
                "the SQL holds no statement, only comments or semicolons: give one query",
            ));
        }
        prune::Statements::Many => {
            return Err(Error::config(
                "the SQL holds more than one statement: query runs one query (SELECT, FROM, WITH, VALUES, DESCRIBE, SUMMARIZE, SHOW or PIVOT), so run each on its own",
            ));
        }
    };
    // Statements that are not queries would fail to parse as the subquery they run as: said
    // plainly, before anything is read.
    const NOT_QUERIES: [&str; 26] = [
        "alter",
        "analyze",
        "attach",
        "begin",
        "call",
        "checkpoint",
        "comment",
        "commit",
        "copy",
        "create",
        "deallocate",
        "delete",
        "detach",
        "drop",
        "execute",
        "explain",
        "export",
        "import",
        "insert",
        "install",
        "load",
        "pragma",
        "prepare",
        "set",
        "update",
        "vacuum",
    ];
    if let Some(word) = prune::first_word(&sql).filter(|w| NOT_QUERIES.contains(&w.as_str())) {
        return Err(Error::config(format!(
            "query runs one query (SELECT, FROM, WITH, VALUES, DESCRIBE, SUMMARIZE, SHOW or PIVOT) over the lake's views, not {} statements: for anything else, run lakecdc view's SQL in your own DuckDB",
            word.to_uppercase()
        )));
    }
    let started = std::time::Instant::now();
    let schemas = catalog::lake_schemas(ctx, &opts.schemas).await?;
    tracing::debug!(
        schemas = schemas.len(),
        ms = started.elapsed().as_millis() as u64,
        "catalog read"
    );
    let names: Vec<String> = schemas.iter().map(|s| s.reg.name.clone()).collect();
    let named = prune::named_views(&sql, &names);
    let pin = prune::row_id_pin(&sql);
    let as_of = opts
        .as_of
        .as_deref()
        .map(|text| AsOf::parse(text, ctx.clock.now_ms()))
        .transpose()?;
    let (scratch, engine) = job::scratch(&opts.work_dir, &opts.engine)?;
    let cache = if !ctx.lake.store.is_local() {
        Some(cache::Cache::open(&opts.cache_dir, opts.cache_max)?)
    } else {
        None
    };
    let mut report = QueryReport::default();
    let mut views = Vec::new();
    let schemas: Vec<catalog::LakeSchema> = schemas
        .into_iter()
        .filter(|s| {
            named
                .as_ref()
                .is_none_or(|n| n.contains(&s.reg.name.to_lowercase()))
        })
        .collect();
    let regs: Vec<&Registered> = schemas.iter().map(|s| &s.reg).collect();
    if let Some((_, _, clash)) = catalog::view_name_clashes(&regs).into_iter().next() {
        return Err(clash);
    }
    // What the earlier views hold until the query ends: the descriptor budget and the cache's
    // eviction are the whole query's.
    let mut held = Held::default();
    for schema in schemas {
        let reg = &schema.reg;
        let m = pinned(ctx, reg, schema.manifest, as_of.as_ref()).await?;
        let mut read = SchemaRead {
            schema: reg.name.clone(),
            schema_id: reg.id,
            version: m.version,
            files_listed: m.files.len(),
            ..SchemaRead::default()
        };
        let files = pruned(reg, &m, pin.as_ref());
        read.files_read = files.len();
        let t = std::time::Instant::now();
        let ready = materialise(
            ctx,
            opts,
            cache.as_ref(),
            &scratch,
            &files,
            &mut held,
            &mut read,
        )
        .await?;
        tracing::debug!(schema = %reg.name, files = files.len(), ms = t.elapsed().as_millis() as u64, "files checked and ready");
        views.push((reg.name.clone(), ready));
        report.schemas.push(read);
    }
    let (format, output) = (opts.format, opts.output.clone());
    let sql_text = sql.clone();
    let lake = ctx.lake.store.describe();
    let spill = scratch.path().to_path_buf();
    let rows = tokio::task::spawn_blocking(move || -> Result<u64> {
        let t = std::time::Instant::now();
        let db = Engine::open(&engine)?;
        for (name, files) in &views {
            db.execute(&statements(name, files)?, "create the lake's views")?;
        }
        tracing::debug!(
            ms = t.elapsed().as_millis() as u64,
            "engine open, views made"
        );
        let t = std::time::Instant::now();
        let readable: Vec<&str> = views
            .iter()
            .flat_map(|(_, files)| files.iter().map(|f| f.path.as_str()))
            .collect();
        let rows = if format == Format::Parquet {
            output::parquet_via(&output, &spill, |path| {
                db.seal(&readable, Some(path))?;
                db.export_parquet(&sql_text, path)
            })
            .map_err(|e| unknown_table(e, &names, &lake))?
        } else {
            let mut out = output::Output::open(&output, format)?;
            db.seal(&readable, None)?;
            let schema = db
                .stream(&sql_text, |batch| out.batch(batch))
                .map_err(|e| unknown_table(e, &names, &lake))?;
            out.finish(schema)?
        };
        drop(views);
        tracing::debug!(
            rows,
            ms = t.elapsed().as_millis() as u64,
            "query run, result written"
        );
        Ok(rows)
    })
    .await
    .map_err(Error::task("run the query"))??;
    report.rows = rows;
    if let Some(cache) = &cache {
        report.evicted = cache.evict(cache.max_bytes(), &BTreeSet::new())?.files;
    }
    drop(scratch);
    for s in &report.schemas {
        tracing::info!(
            schema = %s.schema,
            version = s.version,
            files_listed = s.files_listed,
            files_read = s.files_read,
            downloaded = s.downloaded,
            cache_hits = s.cache_hits,
            "read"
        );
    }
    Ok(report)
}

/// A query naming a schema the lake does not hold fails in DuckDB as an unknown table: said
/// as what it is, with the schemas there are.
fn unknown_table(e: Error, names: &[String], lake: &str) -> Error {
    let Error::Query { message } = &e else {
        return e;
    };
    let Some(table) = message
        .strip_prefix("Catalog Error: Table with name ")
        .and_then(|rest| rest.split_once(" does not exist"))
        .map(|(t, _)| t)
    else {
        return e;
    };
    Error::config(format!(
        "query: no schema {} in the lake {lake} (its schemas: {}); a schema appears once lakecdc init or flush has written its manifest",
        crate::config::escape_name(table),
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    ))
}

/// The most SQL read from a file or standard input: a query is text a person wrote, and a
/// path such as `/dev/zero` must not grow the process without end.
const SQL_LIMIT: u64 = 16 * 1024 * 1024;

async fn read_sql(source: &SqlSource) -> Result<String> {
    let read = |from: Box<dyn Read + Send>, path: PathBuf| -> Result<String> {
        let bytes = crate::config::read_at_most(from, SQL_LIMIT)
            .map_err(|source| Error::Io {
                op: "read the SQL from",
                path: path.clone(),
                source,
            })?
            .ok_or_else(|| {
                Error::config(format!(
                    "the SQL in {} is longer than {} MiB: give a query, not data",
                    path.display(),
                    SQL_LIMIT >> 20
                ))
            })?;
        String::from_utf8(bytes)
            .map_err(|_| Error::config(format!("the SQL in {} is not UTF-8 text", path.display())))
    };
    let sql = match source {
        SqlSource::Text(s) => s.clone(),
        SqlSource::File(p) => {
            let p = p.clone();
            tokio::task::spawn_blocking(move || {
                let file = File::open(&p).map_err(|source| Error::Io {
                    op: "read the SQL file",
                    path: p.clone(),
                    source,
                })?;
                read(Box::new(file), p)
            })
            .await
            .map_err(Error::task("read the SQL"))??
        }
        SqlSource::Stdin => tokio::task::spawn_blocking(move || {
            read(Box::new(std::io::stdin()), PathBuf::from("<stdin>"))
        })
        .await
        .map_err(Error::task("read the SQL"))??,
    };
    if sql.trim().is_empty() {
        return Err(Error::config(
            "no SQL given: pass it as the argument, with -f FILE, or on standard input",
        ));
    }
    Ok(sql)
}

/// The manifest the query reads: the newest (`live`), or the history copy `--as-of` names;
/// every listed path checked to be the schema's own data file.
async fn pinned(
    ctx: &Context,
    reg: &Registered,
    live: Manifest,
    as_of: Option<&AsOf>,
) -> Result<Manifest> {
    let (store, layout) = (ctx.lake.store.as_ref(), &ctx.lake.layout);
    let m = match as_of {
        Some(as_of) => history::load_as_of(store, layout, reg.id, as_of).await?,
        None => live,
    };
    let key = layout.manifest_key(reg.id);
    for f in &m.files {
        // Only this schema's own data files are ever read (docs/security.md).
        if let Err(foreign) = layout.check_listed(reg.id, &f.path) {
            return Err(foreign.refusal(&key, "read"));
        }
    }
    Ok(m)
}

/// The files a view of `reg` reads: all listed, or under a `row_id` pin on it those whose
/// range can hold a pinned id, plus as few others as give the view every column, with every
/// type, that all the listed files give it (the smallest first). The view is then the same
/// relation as without the pin, restricted to rows the query cannot see: a column missing from
/// the kept files would drop out of `SELECT *`, fail a query naming it, or let a name in its
/// `WHERE` bind to a select-list alias instead (docs/hazards.md R8). Without every entry's
/// recorded columns there is no pruning.
fn pruned(reg: &Registered, m: &Manifest, pin: Option<&prune::Pin>) -> Vec<FileEntry> {
    let name = reg.name.to_lowercase();
    let Some(pin) = pin.filter(|p| p.view == name || p.view == format!("{name}__history")) else {
        return m.files.clone();
    };
    let Some(typed) = m
        .files
        .iter()
        .map(|f| f.columns.as_ref())
        .collect::<Option<Vec<_>>>()
    else {
        return m.files.clone();
    };
    let mut keep: Vec<bool> = m
        .files
        .iter()
        .map(|f| prune::may_hold(&f.row_id_min, &f.row_id_max, &pin.ids))
        .collect();
    // Every (column, type) pair the listed files have, less those the kept files have.
    let mut missing: BTreeSet<(&str, &str)> = typed
        .iter()
        .flat_map(|c| c.iter().map(|(n, t)| (n.as_str(), t.as_str())))
        .collect();
    for (cols, _) in typed.iter().zip(&keep).filter(|(_, k)| **k) {
        for (n, t) in cols.iter() {
            missing.remove(&(n.as_str(), t.as_str()));
        }
    }
    // At least one file, so the view has the system columns' types from a file.
    while !missing.is_empty() || !keep.iter().any(|k| *k) {
        let best = (0..m.files.len()).filter(|i| !keep[*i]).max_by_key(|i| {
            let covers = typed[*i]
                .iter()
                .filter(|(n, t)| missing.contains(&(n.as_str(), t.as_str())))
                .count();
            (covers, std::cmp::Reverse(m.files[*i].size_bytes))
        });
        let Some(i) = best else { break };
        keep[i] = true;
        for (n, t) in typed[i].iter() {
            missing.remove(&(n.as_str(), t.as_str()));
        }
    }
    m.files
        .iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(f, _)| f.clone())
        .collect()
}

/// The entry's checksum digits, which name its cached file: only a well-formed checksum, so
/// no manifest can steer the cache outside its directory (docs/hazards.md S15; the manifest's
/// load refuses a malformed one first).
fn checksum_hex(f: &FileEntry) -> Option<&str> {
    f.checksum.as_deref().and_then(manifest::sha256_hex)
}

fn size_of(f: &FileEntry) -> u64 {
    u64::try_from(f.size_bytes).unwrap_or(0)
}

/// Descriptors kept free for DuckDB, the runtime and the store while a local lake's files are
/// held open.
const SPARE_DESCRIPTORS: u64 = 256;

/// Whether `files` descriptors can be held open: the soft limit is raised to the hard one when
/// it is short. When even that is short, files are read by path after their check (a link is
/// still refused when the file is opened; a swap after the check is then not excluded).
fn can_hold_open(files: usize) -> bool {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let need = (files as u64).saturating_add(SPARE_DESCRIPTORS);
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current.is_some_and(|c| c >= need) || limit.current.is_none() {
        return true;
    }
    limit.current = limit.maximum;
    let _ = setrlimit(Resource::Nofile, limit);
    let now = getrlimit(Resource::Nofile).current;
    let enough = now.is_none_or(|c| c >= need);
    if !enough {
        tracing::warn!(
            files,
            "more lake files than open descriptors allowed: read by path after each check (raise ulimit -n)"
        );
    }
    enough
}

/// What the views made so far hold until the query ends.
#[derive(Default)]
struct Held {
    /// Local lake files held open.
    open: usize,
    /// Cached files the views name: no later view's eviction may remove them.
    cached: BTreeSet<PathBuf>,
}

/// Makes every file of one view readable, checked, beside what the earlier views `held`
/// (which it adds to).
async fn materialise(
    ctx: &Context,
    opts: &QueryOptions,
    cache: Option<&cache::Cache>,
    scratch: &Scratch,
    files: &[FileEntry],
    held: &mut Held,
    read: &mut SchemaRead,
) -> Result<Vec<Ready>> {
    let store = ctx.lake.store.as_ref();
    let Some(cache) = cache else {
        let hold = can_hold_open(held.open.saturating_add(files.len()));
        // Hashed whatever --verify says: a same-size change of a lake file is otherwise read
        // as the data (docs/hazards.md R15). `--parallelism` files at once, in order.
        use futures::{StreamExt, TryStreamExt};
        let ready: Vec<Ready> = futures::stream::iter(files)
            .map(|f| in_place(store, f, hold))
            .buffered(opts.parallelism.max(1))
            .try_collect()
            .await?;
        held.open += ready.iter().filter(|r| r._open.is_some()).count();
        return Ok(ready);
    };
    let mut ready = Vec::with_capacity(files.len());
    let mut missing = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let hit = match checksum_hex(f) {
            Some(hex) => cache.hit(hex, size_of(f), opts.verify)?,
            None => None,
        };
        match hit {
            Some(path) => {
                read.cache_hits += 1;
                ready.push(Some(Ready {
                    path: path.display().to_string(),
                    _open: None,
                }));
            }
            None => {
                ready.push(None);
                missing.push(i);
            }
        }
    }
    held.cached
        .extend(ready.iter().flatten().map(|r| PathBuf::from(&r.path)));
    if !missing.is_empty() {
        let incoming: u64 = missing.iter().map(|i| size_of(&files[*i])).sum();
        cache.evict(cache.max_bytes().saturating_sub(incoming), &held.cached)?;
    }
    let fetched: Vec<(usize, PathBuf)> = stream::iter(missing.iter().copied())
        .map(|i| {
            let f = &files[i];
            async move {
                let path = match checksum_hex(f) {
                    Some(hex) => cache.fetch(store, &f.path, hex, size_of(f)).await?,
                    None => unchecked_download(store, scratch, f).await?,
                };
                Ok::<_, Error>((i, path))
            }
        })
        .buffer_unordered(opts.parallelism.max(1))
        .try_collect()
        .await?;
    for (i, path) in fetched {
        held.cached.insert(path.clone());
        read.downloaded += 1;
        read.downloaded_bytes += size_of(&files[i]);
        ready[i] = Some(Ready {
            path: path.display().to_string(),
            _open: None,
        });
    }
    Ok(ready.into_iter().flatten().collect())
}

/// A listed file with no checksum (an old writer's): downloaded, size-checked, to the query's
/// scratch directory, never cached.
async fn unchecked_download(
    store: &dyn crate::store::ObjectStore,
    scratch: &Scratch,
    f: &FileEntry,
) -> Result<PathBuf> {
    tracing::warn!(key = %f.path, "the manifest records no checksum: read with its size checked only");
    let path = scratch
        .path()
        .join(format!("{}.parquet", uuid::Uuid::new_v4()));
    let got = store
        .get_to_file_within(&f.path, &path, size_of(f))
        .await
        .map_err(|source| Error::Storage {
            op: "download",
            key: f.path.clone(),
            source,
        })?;
    if got.size != size_of(f) {
        return Err(Error::Unverified {
            key: f.path.clone(),
            message: format!(
                "it is {} bytes, the manifest says {}",
                got.size, f.size_bytes
            ),
        });
    }
    Ok(path)
}

/// A local lake's file, opened without following links and checked (size and SHA-256), read
/// in place through its open descriptor so what DuckDB reads is what was checked.
async fn in_place(
    store: &dyn crate::store::ObjectStore,
    f: &FileEntry,
    hold: bool,
) -> Result<Ready> {
    let storage = |source| Error::Storage {
        op: "open",
        key: f.path.clone(),
        source,
    };
    let file = match store.open_local(&f.path).await {
        Some(opened) => opened.map_err(storage)?,
        None => return Err(Error::Invariant("in-place read of a remote store".into())),
    };
    let io = |source| Error::Io {
        op: "check the lake file",
        path: PathBuf::from(store.uri(&f.path)),
        source,
    };
    let size = file.metadata().map_err(io)?.len();
    if size != size_of(f) {
        return Err(Error::Unverified {
            key: f.path.clone(),
            message: format!("it is {size} bytes, the manifest says {}", f.size_bytes),
        });
    }
    let file = {
        let want = checksum_hex(f).map(str::to_string);
        let (file, got) = tokio::task::spawn_blocking(move || {
            let got = cache::hash_file(&file);
            (file, got)
        })
        .await
        .map_err(Error::task("hash a lake file"))?;
        let got = got.map_err(io)?;
        match want {
            Some(want) if want != got => {
                return Err(Error::Unverified {
                    key: f.path.clone(),
                    message: format!("its sha256 is {got}, the manifest says {want}"),
                });
            }
            None => tracing::warn!(key = %f.path, "the manifest records no checksum: not hashed"),
            Some(_) => {}
        }
        file
    };
    if !hold || !Path::new("/proc/self/fd").is_dir() {
        // Read by path after the check ([`can_hold_open`]).
        return Ok(Ready {
            path: store.uri(&f.path),
            _open: None,
        });
    }
    Ok(Ready {
        path: format!("/proc/self/fd/{}", file.as_raw_fd()),
        _open: Some(file),
    })
}

/// The views of one schema over its ready files.
fn statements(name: &str, files: &[Ready]) -> Result<String> {
    schema_views(name, files.iter().map(|f| f.path.as_str()), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_listing_no_file_is_an_empty_view_of_the_system_columns() {
        let db = Engine::open(&EngineConfig::default()).unwrap();
        db.execute(&statements("my schema", &[]).unwrap(), "views")
            .unwrap();
        let mut rows = 0;
        let schema = db
            .stream(
                "SELECT row_id, changed_at, deleted_at FROM \"my schema\"",
                |b| {
                    rows += b.num_rows();
                    Ok(())
                },
            )
            .unwrap();
        assert_eq!(rows, 0);
        assert_eq!(schema.fields().len(), 3);
        let e = db
            .stream("SELECT nope FROM \"my schema\"", |_| Ok(()))
            .unwrap_err();
        assert!(
            matches!(e, Error::Query { .. }) && !e.to_string().contains('\n'),
            "{e}"
        );
    }
}
