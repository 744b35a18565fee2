//! A test writer that follows the writer contract exactly (docs/design.md §2, docs/design.md §2.2): every write
//! upserts the row's single dirty slot with the row's new version, versions are strictly
//! increasing per row (`GREATEST(now, prev + 1)`), a hard delete stamps `max(now, prev + 1)`,
//! a recreate stamps above every version ever recorded for the row. It keeps a model of what
//! it wrote, which the oracle compares the lake against — independently of lakecdc's code.

use std::collections::BTreeMap;

use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::oracle::V;

/// The example `customer` schema's attributes as the test models them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Customer {
    pub name: Option<String>,
    pub email: Option<String>,
    pub age: Option<i16>,
    pub loyalty_points: Option<i32>,
    pub lifetime_value: Option<f64>,
    pub external_id: Option<Uuid>,
    pub birth_date: Option<i64>,
    pub signup_at: Option<i64>,
    pub is_active: Option<bool>,
    pub newsletter: Option<bool>,
    pub city: Option<String>,
    pub credit_limit: Option<i64>,
    pub rating: Option<i16>,
    pub visits: Option<i32>,
    pub balance: Option<f64>,
    pub last_login: Option<i64>,
    pub referrer_id: Option<Uuid>,
    pub vip: Option<bool>,
    pub anniversary: Option<i64>,
    pub tags: Option<Vec<String>>,
    pub phone: Option<String>,
}

/// A deterministic generator (xorshift64*), so a failing seed can be replayed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn opt<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> Option<T> {
        if self.chance(15) { None } else { Some(f(self)) }
    }
    pub fn uuid(&mut self) -> Uuid {
        let hi = self.next() as u128;
        let lo = self.next() as u128;
        uuid::Builder::from_random_bytes(((hi << 64) | lo).to_be_bytes()).into_uuid()
    }
}

impl Customer {
    pub fn random(r: &mut Rng) -> Self {
        let words = [
            "alpha",
            "beta",
            "gamma",
            "delta",
            "epsilon",
            "zeta",
            "ü-nicode",
            "it's",
        ];
        let ms = |r: &mut Rng| 946_684_800_000 + (r.below(900_000_000_000) as i64);
        Self {
            name: r.opt(|r| format!("{} {}", words[r.below(8) as usize], r.below(1000))),
            email: r.opt(|r| format!("u{}@example.com", r.below(100_000))),
            age: r.opt(|r| r.below(120) as i16),
            loyalty_points: r.opt(|r| r.below(1_000_000) as i32 - 1000),
            lifetime_value: r.opt(|r| (r.below(10_000_000) as f64) / 100.0),
            external_id: r.opt(|r| r.uuid()),
            birth_date: r.opt(ms),
            signup_at: r.opt(ms),
            is_active: r.opt(|r| r.chance(50)),
            newsletter: r.opt(|r| r.chance(50)),
            city: r.opt(|r| words[r.below(8) as usize].to_string()),
            credit_limit: r.opt(|r| r.below(1 << 40) as i64 - (1 << 39)),
            rating: r.opt(|r| 1 + r.below(5) as i16),
            visits: r.opt(|r| r.below(5000) as i32),
            balance: r.opt(|r| (r.below(1_000_000) as f64) / 8.0 - 500.0),
            last_login: r.opt(ms),
            referrer_id: r.opt(|r| r.uuid()),
            vip: r.opt(|r| r.chance(20)),
            anniversary: r.opt(ms),
            tags: r.opt(|r| {
                (0..r.below(4))
                    .map(|i| format!("t{i}-{}", r.below(50)))
                    .collect()
            }),
            phone: r.opt(|r| format!("+1 555 {:04}", r.below(10_000))),
        }
    }

    /// The lake column values this entity must have (docs/design.md §3.1 typing).
    pub fn expected(&self) -> BTreeMap<&'static str, V> {
        let s = |v: &Option<String>| v.clone().map_or(V::Null, V::Str);
        let i = |v: Option<i64>| v.map_or(V::Null, V::Int);
        let f = |v: Option<f64>| v.map_or(V::Null, V::F);
        let b = |v: Option<bool>| v.map_or(V::Null, V::Bool);
        let u = |v: Option<Uuid>| v.map_or(V::Null, V::Uuid);
        BTreeMap::from([
            ("name", s(&self.name)),
            ("email", s(&self.email)),
            ("age", i(self.age.map(i64::from))),
            ("loyalty_points", i(self.loyalty_points.map(i64::from))),
            ("lifetime_value", f(self.lifetime_value)),
            ("external_id", u(self.external_id)),
            ("birth_date", i(self.birth_date)),
            ("signup_at", i(self.signup_at)),
            ("is_active", b(self.is_active)),
            ("newsletter", b(self.newsletter)),
            ("contact_address_city", s(&self.city)),
            ("credit_limit", i(self.credit_limit)),
            ("rating", f(self.rating.map(f64::from))),
            ("visits", f(self.visits.map(f64::from))),
            ("balance", f(self.balance)),
            ("last_login", i(self.last_login)),
            ("referrer_id", u(self.referrer_id)),
            ("vip", b(self.vip)),
            ("anniversary", i(self.anniversary)),
            (
                "tags",
                self.tags.as_ref().map_or(V::Null, |t| {
                    V::List(t.iter().cloned().map(V::Str).collect())
                }),
            ),
            ("contact_phone", s(&self.phone)),
        ])
    }
}

/// What the model knows about one row.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRow {
    pub value: Customer,
    pub version: i64,
    pub created_at: i64,
    /// Soft-deleted rows are not live.
    pub soft_deleted: bool,
}

/// Writes through the contract and records the model.
pub struct Writer {
    pub client: Client,
    pub schema_id: i16,
    pub rows: BTreeMap<Uuid, ModelRow>,
    /// Hard-deleted ids, candidates for recreation.
    pub deleted: Vec<Uuid>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn iso(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // civil_from_days (Howard Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        sod / 3600,
        (sod / 60) % 60,
        sod % 60
    )
}

impl Writer {
    pub async fn new(client: Client, schema_id: i16) -> Self {
        Self {
            client,
            schema_id,
            rows: BTreeMap::new(),
            deleted: Vec::new(),
        }
    }

    async fn write_eav(tx: &tokio_postgres::Transaction<'_>, sid: i16, id: Uuid, c: &Customer) {
        tx.execute(
            "DELETE FROM eav_data WHERE schema_id = $1 AND row_id = $2",
            &[&sid, &id],
        )
        .await
        .unwrap();
        let num = |attr: i16, v: Option<f64>| (attr, String::new(), None::<String>, v);
        let mut rows: Vec<(i16, String, Option<String>, Option<f64>)> = Vec::new();
        if let Some(v) = c.credit_limit {
            rows.push(num(11, Some(v as f64)));
        }
        if let Some(v) = c.rating {
            rows.push(num(12, Some(f64::from(v))));
        }
        if let Some(v) = c.visits {
            rows.push(num(13, Some(f64::from(v))));
        }
        if let Some(v) = c.balance {
            rows.push(num(14, Some(v)));
        }
        if let Some(v) = c.last_login {
            rows.push(num(15, Some(v as f64)));
        }
        if let Some(v) = c.referrer_id {
            rows.push((16, String::new(), Some(v.to_string()), None));
        }
        if let Some(v) = c.vip {
            rows.push(num(17, Some(if v { 1.0 } else { 0.0 })));
        }
        if let Some(v) = c.anniversary {
            rows.push(num(18, Some(v as f64)));
        }
        match &c.tags {
            None => {}
            Some(t) if t.is_empty() => rows.push((19, String::new(), None, None)),
            Some(t) => {
                for (i, tag) in t.iter().enumerate() {
                    rows.push((19, i.to_string(), Some(tag.clone()), None));
                }
            }
        }
        if let Some(v) = &c.phone {
            rows.push((20, String::new(), Some(v.clone()), None));
        }
        for (attr, idx, text, numeric) in rows {
            tx.execute(
                "INSERT INTO eav_data (schema_id, row_id, attr_id, array_indices, value_text, value_numeric) VALUES ($1, $2, $3, $4, $5, $6)",
                &[&sid, &id, &attr, &idx, &text, &numeric],
            )
            .await
            .unwrap();
        }
    }

    async fn upsert_slot(
        tx: &tokio_postgres::Transaction<'_>,
        sid: i16,
        id: Uuid,
        version: i64,
        deleted_at: Option<i64>,
    ) {
        tx.execute(
            "INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at, deleted_at) VALUES ($1, $2, 0, $3, $4) \
             ON CONFLICT (schema_id, row_id, flushed_at) DO UPDATE SET changed_at = EXCLUDED.changed_at, deleted_at = EXCLUDED.deleted_at",
            &[&sid, &id, &version, &deleted_at],
        )
        .await
        .unwrap();
    }

    fn lock_key(sid: i16, id: Uuid) -> i64 {
        // Any stable per-row key works for the test; FNV-1a over (schema id, row id).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in sid.to_be_bytes().iter().chain(id.as_bytes()) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h as i64
    }

    /// Creates (or re-creates) a row.
    pub async fn create(&mut self, id: Uuid, c: Customer) -> i64 {
        let sid = self.schema_id;
        let tx = self.client.transaction().await.unwrap();
        tx.execute(
            "SELECT pg_advisory_xact_lock($1)",
            &[&Self::lock_key(sid, id)],
        )
        .await
        .unwrap();
        let now = now_ms();
        let version: i64 = tx
            .query_one(
                "SELECT GREATEST($3::int8, COALESCE(MAX(changed_at), 0) + 1) FROM change_log WHERE schema_id = $1 AND row_id = $2",
                &[&sid, &id, &now],
            )
            .await
            .unwrap()
            .get(0);
        tx.execute(
            "INSERT INTO entity_main (ltbase_schema_id, ltbase_row_id, ltbase_created_at, ltbase_updated_at, \
             text_01, text_02, smallint_01, integer_01, double_01, uuid_01, bigint_01, text_03, smallint_02, text_04, text_05) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
            &[
                &sid, &id, &now, &version, &c.name, &c.email, &c.age, &c.loyalty_points, &c.lifetime_value,
                &c.external_id, &c.birth_date, &c.signup_at.map(iso), &c.is_active.map(i16::from),
                &c.newsletter.map(|b| if b { "1" } else { "0" }), &c.city,
            ],
        )
        .await
        .unwrap();
        Self::write_eav(&tx, sid, id, &c).await;
        Self::upsert_slot(&tx, sid, id, version, None).await;
        tx.commit().await.unwrap();
        self.deleted.retain(|d| *d != id);
        self.rows.insert(
            id,
            ModelRow {
                value: c,
                version,
                created_at: now,
                soft_deleted: false,
            },
        );
        version
    }

    /// Updates a live row.
    pub async fn update(&mut self, id: Uuid, c: Customer) -> i64 {
        let sid = self.schema_id;
        let tx = self.client.transaction().await.unwrap();
        let now = now_ms();
        let version: i64 = tx
            .query_one(
                "UPDATE entity_main SET ltbase_updated_at = GREATEST($3::int8, ltbase_updated_at + 1), ltbase_deleted_at = NULL, \
                 text_01 = $4, text_02 = $5, smallint_01 = $6, integer_01 = $7, double_01 = $8, uuid_01 = $9, bigint_01 = $10, \
                 text_03 = $11, smallint_02 = $12, text_04 = $13, text_05 = $14 \
                 WHERE ltbase_schema_id = $1 AND ltbase_row_id = $2 RETURNING ltbase_updated_at",
                &[
                    &sid, &id, &now, &c.name, &c.email, &c.age, &c.loyalty_points, &c.lifetime_value, &c.external_id,
                    &c.birth_date, &c.signup_at.map(iso), &c.is_active.map(i16::from),
                    &c.newsletter.map(|b| if b { "1" } else { "0" }), &c.city,
                ],
            )
            .await
            .unwrap()
            .get(0);
        Self::write_eav(&tx, sid, id, &c).await;
        Self::upsert_slot(&tx, sid, id, version, None).await;
        tx.commit().await.unwrap();
        let row = self.rows.get_mut(&id).unwrap();
        row.value = c;
        row.version = version;
        row.soft_deleted = false;
        version
    }

    /// Soft delete: the row stays in entity_main with `ltbase_deleted_at`; the slot is a
    /// tombstone.
    pub async fn soft_delete(&mut self, id: Uuid) -> i64 {
        let sid = self.schema_id;
        let tx = self.client.transaction().await.unwrap();
        let now = now_ms();
        let version: i64 = tx
            .query_one(
                "UPDATE entity_main SET ltbase_updated_at = GREATEST($3::int8, ltbase_updated_at + 1), \
                 ltbase_deleted_at = GREATEST($3::int8, ltbase_updated_at + 1) \
                 WHERE ltbase_schema_id = $1 AND ltbase_row_id = $2 RETURNING ltbase_updated_at",
                &[&sid, &id, &now],
            )
            .await
            .unwrap()
            .get(0);
        Self::upsert_slot(&tx, sid, id, version, Some(version)).await;
        tx.commit().await.unwrap();
        let row = self.rows.get_mut(&id).unwrap();
        row.version = version;
        row.soft_deleted = true;
        version
    }

    /// Hard delete: entity and EAV rows go; the slot is a tombstone at `max(now, prev + 1)`.
    pub async fn hard_delete(&mut self, id: Uuid) -> i64 {
        let sid = self.schema_id;
        let tx = self.client.transaction().await.unwrap();
        tx.execute(
            "SELECT pg_advisory_xact_lock($1)",
            &[&Self::lock_key(sid, id)],
        )
        .await
        .unwrap();
        let prev: i64 = tx
            .query_one(
                "DELETE FROM entity_main WHERE ltbase_schema_id = $1 AND ltbase_row_id = $2 RETURNING ltbase_updated_at",
                &[&sid, &id],
            )
            .await
            .unwrap()
            .get(0);
        tx.execute(
            "DELETE FROM eav_data WHERE schema_id = $1 AND row_id = $2",
            &[&sid, &id],
        )
        .await
        .unwrap();
        let stamp = now_ms().max(prev + 1);
        Self::upsert_slot(&tx, sid, id, stamp, Some(stamp)).await;
        tx.commit().await.unwrap();
        self.rows.remove(&id);
        self.deleted.push(id);
        stamp
    }

    /// Moves a row's version `ahead_ms` into the future (a clock-ahead writer), dirtying it.
    pub async fn restamp_ahead(&mut self, id: Uuid, ahead_ms: i64) -> i64 {
        let sid = self.schema_id;
        let tx = self.client.transaction().await.unwrap();
        let version = now_ms() + ahead_ms;
        tx.execute(
            "UPDATE entity_main SET ltbase_updated_at = $3 WHERE ltbase_schema_id = $1 AND ltbase_row_id = $2",
            &[&sid, &id, &version],
        )
        .await
        .unwrap();
        let deleted = self.rows[&id].soft_deleted.then_some(version);
        Self::upsert_slot(&tx, sid, id, version, deleted).await;
        tx.commit().await.unwrap();
        self.rows.get_mut(&id).unwrap().version = version;
        version
    }

    /// Takes the versions of `ids` from entity_main into the model (after lakecdc requeued
    /// them: their versions moved, their values did not). Returns them, by id.
    pub async fn follow_versions(&mut self, ids: &[Uuid]) -> BTreeMap<Uuid, i64> {
        let mut out = BTreeMap::new();
        for id in ids {
            let row = self
                .client
                .query_opt(
                    "SELECT ltbase_updated_at FROM entity_main WHERE ltbase_schema_id = $1 AND ltbase_row_id = $2",
                    &[&self.schema_id, id],
                )
                .await
                .unwrap();
            if let (Some(row), Some(m)) = (row, self.rows.get_mut(id)) {
                m.version = row.get(0);
                out.insert(*id, m.version);
            }
        }
        out
    }

    /// One random operation. Returns a short description.
    pub async fn random_op(&mut self, r: &mut Rng) -> &'static str {
        let live: Vec<Uuid> = self
            .rows
            .iter()
            .filter(|(_, m)| !m.soft_deleted)
            .map(|(k, _)| *k)
            .collect();
        let pick = |r: &mut Rng, v: &[Uuid]| v[r.below(v.len() as u64) as usize];
        match r.below(100) {
            _ if live.is_empty() => {
                self.create(r.uuid(), Customer::random(r)).await;
                "insert"
            }
            0..=34 => {
                self.create(r.uuid(), Customer::random(r)).await;
                "insert"
            }
            35..=69 => {
                let id = pick(r, &live);
                self.update(id, Customer::random(r)).await;
                "update"
            }
            70..=77 => {
                let id = pick(r, &live);
                self.soft_delete(id).await;
                "soft delete"
            }
            78..=87 => {
                let id = pick(r, &live);
                self.hard_delete(id).await;
                "hard delete"
            }
            88..=93 if !self.deleted.is_empty() => {
                let id = self.deleted[r.below(self.deleted.len() as u64) as usize];
                self.create(id, Customer::random(r)).await;
                "recreate"
            }
            _ => {
                let id = pick(r, &live);
                self.restamp_ahead(id, 20_000).await;
                "clock ahead"
            }
        }
    }
}
