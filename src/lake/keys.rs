//! Every key shape of the lake (docs/design.md §3), built AND parsed here so that writers and the gc
//! classifier can never drift apart (docs/hazards.md #48). Parsing is strict — every UUID part must be
//! a canonical lowercase hyphenated UUID and the schema id canonical decimal — and anything else
//! is [`KeyKind::Unknown`]; parsing never panics. Keys are used verbatim everywhere (#516).

use std::time::Duration;

use uuid::Uuid;

use super::ReadLimits;
use crate::error::{Error, Result};

/// How long manifest history copies are kept when `--history-retention` is not set: 24 hours
/// (re-exported as [`super::history::DEFAULT_RETENTION`]).
pub const DEFAULT_HISTORY_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// The directory under the lake root that `lakecdc doctor` probes the store in.
const DOCTOR_DIR: &str = "_doctor";

/// The template placeholders accepted in `--manifest-template`.
const PLACEHOLDERS: [&str; 2] = ["{schema_id}", "{{.SchemaID}}"];

/// Where a lake's objects live under its root, how large its metadata objects may be read
/// ([`ReadLimits`]; the lake's readers all take the layout), and how long its manifest history
/// is kept ([`Layout::history_retention`]; every save and gc take the layout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// `{root}/{data}` with no leading or trailing `/`; empty means the root itself.
    data_prefix: String,
    /// `{root}/` (or empty) followed by the manifest template.
    manifest_template: String,
    /// The manifest template alone (relative to the lake root).
    manifest_in_lake: String,
    /// Size limits of the metadata objects read.
    limits: ReadLimits,
    /// How long manifest history copies are kept; zero writes none.
    history_retention: Duration,
    /// `{root}/_doctor/` (or `_doctor/`): the only place `lakecdc doctor` writes.
    doctor_prefix: String,
}

/// A path a manifest lists or retires that is not a data file of the manifest's own schema: a
/// key of another schema, outside the lake's data prefix, or of no shape lakecdc writes (`..`
/// segments, a leading `/`). No job reads, HEADs, retires or deletes it (docs/hazards.md S1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path:?} is not a data file of schema {schema_id} under {schema_prefix}")]
pub struct ForeignPath {
    /// The path, as the manifest spells it.
    pub path: String,
    /// The manifest's schema.
    pub schema_id: i16,
    /// That schema's data prefix.
    pub schema_prefix: String,
}

impl ForeignPath {
    /// The refusal of a job that will not `doing` (e.g. "compact it") the manifest `key`.
    pub fn refusal(&self, key: &str, doing: &str) -> Error {
        Error::Manifest {
            key: key.to_string(),
            message: format!(
                "entry {self}: refusing to {doing} (remove the entry from the manifest if it does not belong there)"
            ),
        }
    }
}

/// What a key in a schema's data prefix is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// `{data}/{schema}/{uuid}.parquet`, written by flush.
    Delta {
        /// The schema id.
        schema_id: i16,
        /// The file UUID.
        file: Uuid,
    },
    /// `{data}/{schema}/_tmp/{uuid}.parquet`, staging of releases before 2026-12-05 (no writer
    /// stages any more; gc still deletes what they left).
    Tmp {
        /// The schema id.
        schema_id: i16,
        /// The file UUID.
        file: Uuid,
    },
    /// `{data}/{schema}/{min}_{max}_{uuid}.parquet` (or legacy `{min}_{max}.parquet`), by init.
    InitBase {
        /// The schema id.
        schema_id: i16,
        /// Smallest row id in the file.
        min: Uuid,
        /// Largest row id in the file.
        max: Uuid,
        /// The file UUID (absent in the legacy two-part shape).
        file: Option<Uuid>,
    },
    /// `{data}/{schema}/base-{uuid}.parquet`, by compact (and zero-row bases).
    MergedBase {
        /// The schema id.
        schema_id: i16,
        /// The file UUID.
        file: Uuid,
    },
    /// `{data}/{schema}/_owner.json`: names the manifest the prefix belongs to
    /// ([`super::owner`]).
    Owner {
        /// The schema id.
        schema_id: i16,
    },
    /// Anything else: never touched by gc.
    Unknown,
}

impl KeyKind {
    /// Whether the key is a base file's (init's or a merge's).
    pub fn is_base(&self) -> bool {
        matches!(self, KeyKind::InitBase { .. } | KeyKind::MergedBase { .. })
    }

    /// The schema the key belongs to, when it is a known shape.
    pub fn schema_id(&self) -> Option<i16> {
        match *self {
            KeyKind::Delta { schema_id, .. }
            | KeyKind::Tmp { schema_id, .. }
            | KeyKind::InitBase { schema_id, .. }
            | KeyKind::MergedBase { schema_id, .. }
            | KeyKind::Owner { schema_id } => Some(schema_id),
            KeyKind::Unknown => None,
        }
    }
}

impl Layout {
    /// Builds a layout from the lake root (the part of `s3://bucket/root` after the bucket, or
    /// empty), the data prefix and the manifest template. Refuses prefixes that would produce
    /// ambiguous keys and templates without a schema placeholder (which would make every schema
    /// share one manifest, docs/hazards.md #520/#522/#536).
    pub fn new(root: &str, data_prefix: &str, manifest_template: &str) -> Result<Self> {
        let root = clean_prefix(root, "lake")?;
        let data = clean_prefix(data_prefix, "data-prefix")?;
        if !PLACEHOLDERS.iter().any(|p| manifest_template.contains(p)) {
            return Err(Error::setting(
                "manifest-template",
                format!(
                    "{manifest_template:?} has no {{schema_id}} placeholder: every schema would share one manifest; use e.g. manifest/{{schema_id}}.json"
                ),
            ));
        }
        let rendered = render(manifest_template, 1);
        if rendered.contains(['{', '}']) || clean_prefix(&rendered, "manifest-template").is_err() {
            return Err(Error::setting(
                "manifest-template",
                format!(
                    "{manifest_template:?} must be a relative key like manifest/{{schema_id}}.json"
                ),
            ));
        }
        Ok(Self {
            data_prefix: join(&root, &data),
            manifest_template: join(&root, manifest_template),
            manifest_in_lake: manifest_template.to_string(),
            limits: ReadLimits::default(),
            history_retention: DEFAULT_HISTORY_RETENTION,
            doctor_prefix: format!("{}/", join(&root, DOCTOR_DIR)),
        })
    }

    /// The same layout, its metadata objects read within `limits`.
    pub fn with_limits(mut self, limits: ReadLimits) -> Self {
        self.limits = limits;
        self
    }

    /// How large its metadata objects may be read.
    pub fn limits(&self) -> &ReadLimits {
        &self.limits
    }

    /// The same layout, keeping manifest history copies for `retention` (zero: every save
    /// writes none and gc keeps none; docs/design.md §3.5).
    pub fn with_history_retention(mut self, retention: Duration) -> Self {
        self.history_retention = retention;
        self
    }

    /// How long manifest history copies are kept (zero: none are written).
    pub fn history_retention(&self) -> Duration {
        self.history_retention
    }

    /// The data prefix (`{root}/{data}`), possibly empty.
    pub fn data_prefix(&self) -> &str {
        &self.data_prefix
    }

    /// `{root}/_doctor/`: where `lakecdc doctor` puts (and removes) its probe objects, outside
    /// every data prefix and manifest key (docs/operations.md, `doctor`).
    pub fn doctor_prefix(&self) -> &str {
        &self.doctor_prefix
    }

    /// `{data}/{schema}/`: every object of the schema lies under it.
    pub fn schema_prefix(&self, schema_id: i16) -> String {
        format!("{}/", join(&self.data_prefix, &schema_id.to_string()))
    }

    /// A delta key.
    pub fn delta_key(&self, schema_id: i16, file: Uuid) -> String {
        format!(
            "{}{}.parquet",
            self.schema_prefix(schema_id),
            canonical(file)
        )
    }

    /// A staging key.
    pub fn tmp_key(&self, schema_id: i16, file: Uuid) -> String {
        format!(
            "{}_tmp/{}.parquet",
            self.schema_prefix(schema_id),
            canonical(file)
        )
    }

    /// An init base key.
    pub fn init_base_key(&self, schema_id: i16, min: Uuid, max: Uuid, file: Uuid) -> String {
        format!(
            "{}{}_{}_{}.parquet",
            self.schema_prefix(schema_id),
            canonical(min),
            canonical(max),
            canonical(file)
        )
    }

    /// A merged (or zero-row) base key.
    pub fn merged_base_key(&self, schema_id: i16, file: Uuid) -> String {
        format!(
            "{}base-{}.parquet",
            self.schema_prefix(schema_id),
            canonical(file)
        )
    }

    /// The schema's manifest key.
    pub fn manifest_key(&self, schema_id: i16) -> String {
        render(&self.manifest_template, schema_id)
    }

    /// The longest fixed prefix of every manifest key (the template up to its placeholder):
    /// listing it finds every schema's manifest ([`Layout::manifest_schema`]).
    pub fn manifest_list_prefix(&self) -> &str {
        let at = PLACEHOLDERS
            .iter()
            .filter_map(|p| self.manifest_template.find(p))
            .min()
            .unwrap_or(self.manifest_template.len());
        &self.manifest_template[..at]
    }

    /// The schema whose manifest `key` is, parsed strictly (exactly the key the template
    /// renders for a canonical positive id); `None` for any other key under the prefix (history
    /// copies, gc state, anything planted).
    pub fn manifest_schema(&self, key: &str) -> Option<i16> {
        let rest = key.strip_prefix(self.manifest_list_prefix())?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let id: i16 = digits.parse().ok().filter(|id| *id > 0)?;
        (id.to_string() == digits && self.manifest_key(id) == key).then_some(id)
    }

    /// The schema's manifest key relative to the lake root (what an owner marker records, so a
    /// lake moved to another root keeps its owner).
    pub fn manifest_key_in_lake(&self, schema_id: i16) -> String {
        render(&self.manifest_in_lake, schema_id)
    }

    /// The owner marker of the schema's data prefix.
    pub fn owner_key(&self, schema_id: i16) -> String {
        format!("{}_owner.json", self.schema_prefix(schema_id))
    }

    /// The schema's gc sighting-state key.
    pub fn gc_state_key(&self, schema_id: i16) -> String {
        format!("{}.gc-state", self.manifest_key(schema_id))
    }

    /// `<manifest key>.history/`: every history copy of the schema's manifest lies under it.
    pub fn history_prefix(&self, schema_id: i16) -> String {
        history_prefix_of(&self.manifest_key(schema_id))
    }

    /// `<manifest key>.history/<version:020>.json`: the copy of the manifest as saved at
    /// `version`.
    pub fn history_key(&self, schema_id: i16, version: i64) -> String {
        history_key_of(&self.manifest_key(schema_id), version)
    }

    /// The version of a history copy key of `schema_id`, parsed strictly: the history prefix
    /// followed by exactly 20 ASCII digits and `.json`, nothing else (no sub-directory, sign or
    /// other spelling). Anything else under the prefix is `None` and never touched.
    pub fn parse_history_key(&self, schema_id: i16, key: &str) -> Option<i64> {
        let rest = key.strip_prefix(&self.history_prefix(schema_id))?;
        let digits = rest.strip_suffix(".json")?;
        if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    }

    /// The one check of every path read from the manifest of `schema_id`, listed or retired,
    /// before any job uses it: it must be a data file of that schema (a delta, an init base or
    /// a merged base under its data prefix, parsed strictly). Anything else is a
    /// [`ForeignPath`], which no job reads, HEADs, retires or deletes (docs/hazards.md #417,
    /// S1): a writer limited to one prefix must not make lakecdc touch another's objects.
    pub fn check_listed(&self, schema_id: i16, path: &str) -> Result<KeyKind, ForeignPath> {
        match self.classify(path) {
            kind @ (KeyKind::Delta { .. }
            | KeyKind::InitBase { .. }
            | KeyKind::MergedBase { .. })
                if kind.schema_id() == Some(schema_id) =>
            {
                Ok(kind)
            }
            _ => Err(ForeignPath {
                path: path.to_string(),
                schema_id,
                schema_prefix: self.schema_prefix(schema_id),
            }),
        }
    }

    /// Classifies a key; the inverse of every builder above.
    pub fn classify(&self, key: &str) -> KeyKind {
        self.try_classify(key).unwrap_or(KeyKind::Unknown)
    }

    fn try_classify(&self, key: &str) -> Option<KeyKind> {
        let rest = if self.data_prefix.is_empty() {
            key
        } else {
            key.strip_prefix(self.data_prefix.as_str())?
                .strip_prefix('/')?
        };
        let (schema, rest) = rest.split_once('/')?;
        let schema_id: i16 = schema.parse().ok().filter(|id| *id > 0)?;
        if schema_id.to_string() != schema {
            return None;
        }
        if rest == "_owner.json" {
            return Some(KeyKind::Owner { schema_id });
        }
        if let Some(tmp) = rest.strip_prefix("_tmp/") {
            let file = parse_uuid(tmp.strip_suffix(".parquet")?)?;
            return Some(KeyKind::Tmp { schema_id, file });
        }
        let stem = rest.strip_suffix(".parquet")?;
        if stem.contains('/') {
            return None;
        }
        if let Some(id) = stem.strip_prefix("base-") {
            return Some(KeyKind::MergedBase {
                schema_id,
                file: parse_uuid(id)?,
            });
        }
        let parts: Vec<&str> = stem.split('_').collect();
        match parts.as_slice() {
            [one] => Some(KeyKind::Delta {
                schema_id,
                file: parse_uuid(one)?,
            }),
            [min, max] => Some(KeyKind::InitBase {
                schema_id,
                min: parse_uuid(min)?,
                max: parse_uuid(max)?,
                file: None,
            }),
            [min, max, file] => Some(KeyKind::InitBase {
                schema_id,
                min: parse_uuid(min)?,
                max: parse_uuid(max)?,
                file: Some(parse_uuid(file)?),
            }),
            _ => None,
        }
    }
}

/// The history prefix of the manifest at `manifest_key`.
pub(crate) fn history_prefix_of(manifest_key: &str) -> String {
    format!("{manifest_key}.history/")
}

/// The history copy key of version `version` of the manifest at `manifest_key`.
pub(crate) fn history_key_of(manifest_key: &str, version: i64) -> String {
    format!("{}{version:020}.json", history_prefix_of(manifest_key))
}

fn render(template: &str, schema_id: i16) -> String {
    PLACEHOLDERS.iter().fold(template.to_string(), |t, p| {
        t.replace(p, &schema_id.to_string())
    })
}

fn canonical(id: Uuid) -> String {
    id.as_hyphenated().to_string()
}

/// Parses only the canonical lowercase hyphenated form that the builders write.
fn parse_uuid(s: &str) -> Option<Uuid> {
    if s.len() != 36 {
        return None;
    }
    let id = Uuid::try_parse(s).ok()?;
    (canonical(id) == s).then_some(id)
}

fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a}/{b}"),
    }
}

/// Trims one trailing `/` and refuses leading slashes and empty, `.` or `..` segments.
fn clean_prefix(prefix: &str, setting: &str) -> Result<String> {
    let p = prefix.strip_suffix('/').unwrap_or(prefix);
    if p.is_empty() {
        return Ok(String::new());
    }
    if p.starts_with('/') || p.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        return Err(Error::setting(
            setting,
            format!(
                "{prefix:?} must be a relative path without empty, '.' or '..' segments (e.g. data)"
            ),
        ));
    }
    Ok(p.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_doctor_prefix_is_under_the_root_and_no_key_of_a_job() {
        let l = Layout::new("root", "data", "manifest/{schema_id}.json").unwrap();
        assert_eq!(l.doctor_prefix(), "root/_doctor/");
        let key = format!("{}{}", l.doctor_prefix(), Uuid::nil());
        assert_eq!(l.classify(&key), KeyKind::Unknown);
        assert_eq!(l.manifest_schema(&key), None);
        let bare = Layout::new("", "", "{schema_id}.json").unwrap();
        assert_eq!(bare.doctor_prefix(), "_doctor/");
        assert_eq!(bare.classify("_doctor/x"), KeyKind::Unknown);
    }

    #[test]
    fn manifest_keys_are_found_by_prefix_and_parsed_strictly() {
        let l = Layout::new("root", "data", "manifest/{schema_id}.json").unwrap();
        assert_eq!(l.manifest_list_prefix(), "root/manifest/");
        assert_eq!(l.manifest_schema("root/manifest/7.json"), Some(7));
        for other in [
            "root/manifest/7.json.history/00000000000000000001.json",
            "root/manifest/7.json.gc-state",
            "root/manifest/07.json",
            "root/manifest/0.json",
            "root/manifest/-7.json",
            "root/manifest/99999.json",
            "manifest/7.json",
        ] {
            assert_eq!(l.manifest_schema(other), None, "{other}");
        }
        let nested = Layout::new("", "data", "m/{{.SchemaID}}/manifest.json").unwrap();
        assert_eq!(nested.manifest_list_prefix(), "m/");
        assert_eq!(nested.manifest_schema("m/12/manifest.json"), Some(12));
    }

    fn ids() -> (Uuid, Uuid, Uuid) {
        (Uuid::now_v7(), Uuid::new_v4(), Uuid::now_v7())
    }

    #[test]
    fn every_writer_key_round_trips_through_the_classifier() {
        for (root, data) in [
            ("", "data"),
            ("lakes/prod", "data"),
            ("", ""),
            ("r", "d/e/"),
        ] {
            let l = Layout::new(root, data, "manifest/{schema_id}.json").unwrap();
            let (a, b, c) = ids();
            for schema_id in [1i16, 7, 100, i16::MAX] {
                let cases = [
                    (
                        l.delta_key(schema_id, a),
                        KeyKind::Delta { schema_id, file: a },
                    ),
                    (l.tmp_key(schema_id, b), KeyKind::Tmp { schema_id, file: b }),
                    (
                        l.init_base_key(schema_id, a, b, c),
                        KeyKind::InitBase {
                            schema_id,
                            min: a,
                            max: b,
                            file: Some(c),
                        },
                    ),
                    (
                        l.merged_base_key(schema_id, c),
                        KeyKind::MergedBase { schema_id, file: c },
                    ),
                    (l.owner_key(schema_id), KeyKind::Owner { schema_id }),
                ];
                for (key, want) in cases {
                    assert!(key.starts_with(&l.schema_prefix(schema_id)), "{key}");
                    assert!(!key.starts_with('/') && !key.contains("//"), "{key}");
                    assert_eq!(l.classify(&key), want, "{key}");
                }
            }
        }
    }

    #[test]
    fn legacy_two_part_init_keys_parse() {
        let l = Layout::new("", "data", "manifest/{schema_id}.json").unwrap();
        let (a, b, _) = ids();
        let key = format!("data/7/{a}_{b}.parquet");
        assert_eq!(
            l.classify(&key),
            KeyKind::InitBase {
                schema_id: 7,
                min: a,
                max: b,
                file: None
            }
        );
    }

    #[test]
    fn malformed_keys_are_unknown() {
        let l = Layout::new("", "data", "manifest/{schema_id}.json").unwrap();
        let u = Uuid::now_v7();
        let upper = u.to_string().to_uppercase();
        let simple = u.simple().to_string();
        let bad = [
            String::new(),
            "data".into(),
            "data/".into(),
            format!("data/07/{u}.parquet"),
            format!("data/0/{u}.parquet"),
            format!("data/-1/{u}.parquet"),
            format!("data/40000/{u}.parquet"),
            format!("data/7/{u}.parq"),
            format!("data/7/{upper}.parquet"),
            format!("data/7/{simple}.parquet"),
            format!("data/7/x/{u}.parquet"),
            format!("data/7/_tmp/x/{u}.parquet"),
            format!("data/7/base-{u}_{u}.parquet"),
            format!("data/7/{u}_{u}_{u}_{u}.parquet"),
            format!("data/7/{u}_.parquet"),
            format!("other/7/{u}.parquet"),
            format!("/data/7/{u}.parquet"),
            format!("datax/7/{u}.parquet"),
            "data/7/é.parquet".into(),
            "data/7/\u{0}.parquet".into(),
        ];
        for key in bad {
            assert_eq!(l.classify(&key), KeyKind::Unknown, "{key:?}");
        }
    }

    #[test]
    fn only_data_files_of_the_schema_pass_the_listed_path_check() {
        let l = Layout::new("lakes/prod", "data", "manifest/{schema_id}.json").unwrap();
        let (a, b, c) = ids();
        for ok in [
            l.delta_key(7, a),
            l.init_base_key(7, a, b, c),
            l.merged_base_key(7, c),
            format!("lakes/prod/data/7/{a}_{b}.parquet"),
        ] {
            assert_eq!(l.check_listed(7, &ok).unwrap(), l.classify(&ok), "{ok}");
        }
        for foreign in [
            l.delta_key(8, a),
            l.merged_base_key(70, a),
            l.tmp_key(7, a),
            l.owner_key(7),
            l.manifest_key(7),
            l.gc_state_key(7),
            format!("data/7/{a}.parquet"),
            format!("lakes/prod/other/7/{a}.parquet"),
            format!("/lakes/prod/data/7/{a}.parquet"),
            format!("lakes/prod/data/7/../8/{a}.parquet"),
            format!("lakes/prod/data/8/../7/{a}.parquet"),
            format!("lakes/prod/data/7/./{a}.parquet"),
            format!("lakes/prod/data//7/{a}.parquet"),
            format!("../{a}.parquet"),
            "../x".into(),
            String::new(),
        ] {
            let err = l.check_listed(7, &foreign).unwrap_err();
            assert_eq!(err.path, foreign);
            let msg = err.refusal("m", "read it").to_string();
            assert!(msg.contains(&format!("{foreign:?}")), "{msg}");
            assert!(msg.contains("lakes/prod/data/7/"), "{msg}");
        }
    }

    #[test]
    fn history_keys_round_trip_and_anything_else_is_refused() {
        let l = Layout::new("root", "data", "manifest/{schema_id}.json").unwrap();
        assert_eq!(l.history_prefix(7), "root/manifest/7.json.history/");
        assert_eq!(
            l.history_key(7, 42),
            "root/manifest/7.json.history/00000000000000000042.json"
        );
        for v in [1, 42, i64::MAX] {
            assert_eq!(l.parse_history_key(7, &l.history_key(7, v)), Some(v));
        }
        assert_eq!(l.parse_history_key(8, &l.history_key(7, 1)), None);
        let p = l.history_prefix(7);
        for bad in [
            format!("{p}42.json"),
            format!("{p}0000000000000000042.json"),
            format!("{p}000000000000000000042.json"),
            format!("{p}-0000000000000000042.json"),
            format!("{p}+0000000000000000042.json"),
            format!("{p}00000000000000000042.JSON"),
            format!("{p}00000000000000000042.json.tmp"),
            format!("{p}x/00000000000000000042.json"),
            format!("{p}../00000000000000000042.json"),
            format!("{p}\u{661}0000000000000000042.json"),
            format!("{p}99999999999999999999.json"),
            l.manifest_key(7),
            l.gc_state_key(7),
        ] {
            assert_eq!(l.parse_history_key(7, &bad), None, "{bad:?}");
        }
        assert_eq!(l.history_retention(), DEFAULT_HISTORY_RETENTION);
        let off = l.with_history_retention(Duration::ZERO);
        assert!(off.history_retention().is_zero());
    }

    #[test]
    fn manifest_keys_and_templates() {
        let l = Layout::new("root/", "data", "manifest/{{.SchemaID}}.json").unwrap();
        assert_eq!(l.manifest_key(7), "root/manifest/7.json");
        assert_eq!(l.gc_state_key(7), "root/manifest/7.json.gc-state");
        assert_eq!(l.schema_prefix(7), "root/data/7/");
        assert!(Layout::new("", "data", "manifest/all.json").is_err());
        assert!(Layout::new("", "data", "/manifest/{schema_id}.json").is_err());
        assert!(Layout::new("", "data", "m/{schema_id}/{x}.json").is_err());
        assert!(Layout::new("", "/data", "m/{schema_id}.json").is_err());
        assert!(Layout::new("", "a/../b", "m/{schema_id}.json").is_err());
    }
}
