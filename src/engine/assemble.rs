//! Joins an export's rows with their EAV values in Rust, when that gives exactly the rows the
//! export query's pivot would. A base's keyset pages arrive sorted by row id; a delta's slots
//! are sorted here and their entity rows looked up by id. Each EAV row then finds its row by
//! binary search: a scalar attribute becomes one gathered column, a list attribute a list
//! column of its items in index order (`[]` for the empty-list marker alone, NULL without
//! rows). What is left is casting and encoding (`writer`) — no hash join, aggregate or sort (about a
//! third of an export's CPU). Where the pivot's result is not this one (two rows of one scalar
//! attribute, list indices that are not plain integers or repeat, unsorted pages) `None` is
//! returned and the caller uses the export query.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, FixedSizeBinaryArray, Int16Array, ListArray, StringArray, UInt32Array,
};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::compute::{take, take_record_batch};
use arrow::datatypes::{Field, Schema};
use arrow::record_batch::RecordBatch;

use crate::error::{Error, Result};
use crate::schema::batch::eav;
use crate::schema::{SchemaDef, ValueType};

/// The column of an assembled page holding attribute `id`'s raw EAV value. The prefix cannot
/// be an `entity_main` column of a valid binding.
pub fn raw_column(id: i16) -> String {
    format!("__lakecdc_eav_{id}")
}

/// The pages `entities[i]` + `eav[i]` (entity rows sorted by row id, `ltbase_row_id` first;
/// the EAV rows of the page's row-id range, any order, any attribute), ordered by row id and
/// joined with their EAV values (one [`raw_column`] per EAV attribute), or `None` when only the
/// export query's pivot gives the right rows.
pub fn assemble(
    schema: &SchemaDef,
    entities: &[RecordBatch],
    eav: &[RecordBatch],
) -> Result<Option<Vec<RecordBatch>>> {
    if entities.len() != eav.len() {
        return Ok(None); // not pages
    }
    let attrs = Attributes::of(schema);
    // Each page is sorted; ordering the pages by their first row id orders the rows of pages
    // handed over in any order (checked below).
    let mut order: Vec<usize> = (0..entities.len()).collect();
    order.sort_by_cached_key(|i| {
        ids(&entities[*i])
            .ok()
            .filter(|a| !a.is_empty())
            .map(|a| key(a.value(0)))
    });
    let mut out = Vec::with_capacity(entities.len());
    let mut previous: Option<u128> = None;
    for i in order {
        let keys = keys(ids(&entities[i])?);
        // Strictly increasing within the page and across pages: otherwise the order DuckDB
        // would keep is not the file's order.
        for &k in &keys {
            if previous.is_some_and(|p| p >= k) {
                return Ok(None);
            }
            previous = Some(k);
        }
        let Some(values) = gather_eav(&attrs, &eav[i], &keys)? else {
            return Ok(None);
        };
        let fields: Vec<Arc<Field>> = entities[i].schema().fields().iter().cloned().collect();
        out.push(combine(fields, entities[i].columns().to_vec(), values)?);
    }
    Ok(Some(out))
}

/// The schema's EAV attributes in file order, and each attribute id's place among them.
#[derive(Default)]
struct Attributes {
    order: Vec<(i16, Shape)>,
    /// Each attribute's index in `order`, by attribute id less `first`: looked up for every
    /// EAV row, so a direct index rather than a hash.
    slot: Vec<Option<usize>>,
    first: i16,
}

/// How an attribute's EAV rows become its value.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// One row holds the value.
    Scalar(ValueType),
    /// Rows with numeric `array_indices` hold the items of this type, in index order; a row
    /// with an empty index (read as NULL, `source::live::eav_select`) marks an empty list.
    List(ValueType),
}

impl Shape {
    /// The `eav_data` column the value (or item) is read from.
    fn column(self) -> &'static str {
        match self {
            Shape::Scalar(t) | Shape::List(t) => eav::value_column(t),
        }
    }
}

impl Attributes {
    /// The schema's EAV attributes.
    fn of(schema: &SchemaDef) -> Self {
        let mut attrs = Self::default();
        for a in schema.attributes.iter().filter(|a| a.binding.is_none()) {
            let shape = match a.value_type {
                ValueType::List => Shape::List(a.items_type.unwrap_or(ValueType::Text)),
                t => Shape::Scalar(t),
            };
            attrs.order.push((a.id, shape));
        }
        let ids = || attrs.order.iter().map(|(id, _)| i32::from(*id));
        let (first, last) = (ids().min().unwrap_or(0), ids().max().unwrap_or(-1));
        let mut slot = vec![None; usize::try_from(last - first + 1).unwrap_or(0)];
        for (k, id) in ids().enumerate() {
            if let Some(s) = usize::try_from(id - first)
                .ok()
                .and_then(|i| slot.get_mut(i))
            {
                *s = Some(k);
            }
        }
        attrs.slot = slot;
        attrs.first = i16::try_from(first).unwrap_or(0);
        attrs
    }

    /// The index in `order` of attribute `id`, if the schema has it.
    fn slot_of(&self, id: i16) -> Option<usize> {
        let at = usize::try_from(i32::from(id) - i32::from(self.first)).ok()?;
        self.slot.get(at).copied().flatten()
    }
}

/// The rows of one delta: the change-log `slots` (`row_id, changed_at, deleted_at`) sorted by
/// row id, each followed by its entity row's columns (NULL for a hard-deleted row, which has
/// none) and one gathered column per EAV attribute — what the export query's `cl LEFT JOIN m`
/// and pivot give, in its `ORDER BY row_id`. `None` when only the pivot gives the right rows
/// (see `gather_eav`; two slots or entity rows of one id).
pub fn assemble_slots(
    schema: &SchemaDef,
    slots: &RecordBatch,
    entities: &RecordBatch,
    eav: &RecordBatch,
) -> Result<Option<RecordBatch>> {
    let attrs = Attributes::of(schema);
    let slot_keys = keys(ids(slots)?);
    let mut order: Vec<u32> = (0..index(slot_keys.len())?).collect();
    order.sort_unstable_by_key(|&i| slot_keys[i as usize]);
    let sorted: Vec<u128> = order.iter().map(|&i| slot_keys[i as usize]).collect();
    if sorted.windows(2).any(|w| w[0] >= w[1]) {
        return Ok(None);
    }
    // Each slot's entity row, by a merge of both in row-id order (no hash per row: the
    // entity rows often come sorted already).
    let entity_keys = keys(ids(entities)?);
    let mut by_key: Vec<u32> = (0..index(entity_keys.len())?).collect();
    if !entity_keys.is_sorted() {
        by_key.sort_unstable_by_key(|&i| entity_keys[i as usize]);
    }
    let key_at = |j: usize| by_key.get(j).map(|&i| entity_keys[i as usize]);
    if (1..by_key.len()).any(|j| key_at(j - 1) == key_at(j)) {
        return Ok(None);
    }
    let mut j = 0;
    let matched: UInt32Array = sorted
        .iter()
        .map(|k| {
            while key_at(j).is_some_and(|e| e < *k) {
                j += 1;
            }
            (key_at(j) == Some(*k)).then(|| by_key[j])
        })
        .collect();
    let Some(eav) = gather_eav(&attrs, eav, &sorted)? else {
        return Ok(None);
    };
    let slots =
        take_record_batch(slots, &UInt32Array::from(order)).map_err(Error::arrow("sort slots"))?;
    let mut fields: Vec<Arc<Field>> = slots.schema().fields().iter().cloned().collect();
    let mut columns = slots.columns().to_vec();
    // Entity columns are NULL where a slot has no entity row.
    for (field, column) in entities.schema().fields().iter().zip(entities.columns()) {
        fields.push(Arc::new(field.as_ref().clone().with_nullable(true)));
        columns.push(
            take(column.as_ref(), &matched, None).map_err(Error::arrow("gather entity rows"))?,
        );
    }
    combine(fields, columns, eav).map(Some)
}

/// `fields`/`columns` followed by the gathered EAV columns, as one batch.
fn combine(
    mut fields: Vec<Arc<Field>>,
    mut columns: Vec<ArrayRef>,
    eav: Vec<(Field, ArrayRef)>,
) -> Result<RecordBatch> {
    for (field, column) in eav {
        fields.push(Arc::new(field));
        columns.push(column);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(Error::arrow("assembled rows"))
}

/// `text` as an integer when it is written the one way the integer prints (no sign but a
/// leading `-`, no leading zero, no `-0`), without allocating; other indices leave the item
/// order to the pivot.
fn plain_index(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let leading_zero = digits.len() > 1 && digits.starts_with('0');
    let negative_zero = digits == "0" && text.len() > 1;
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || leading_zero
        || negative_zero
    {
        return None;
    }
    text.parse().ok()
}

/// One column per attribute in `attrs` ([`raw_column`]), holding for each row of `keys` (row
/// ids, strictly increasing) its raw EAV value of that attribute from `eav` (a list of raw
/// items for a list attribute), or NULL. `None` when only the pivot gives the right value: a
/// row with two rows of one scalar attribute (the pivot takes their maximum), or list items
/// whose order the pivot leaves open (an index that is not a plain integer, or two items at
/// one index).
fn gather_eav(
    attrs: &Attributes,
    eav: &RecordBatch,
    keys: &[u128],
) -> Result<Option<Vec<(Field, ArrayRef)>>> {
    let n = keys.len();
    let eav_ids = ids(eav)?;
    let attr_ids = column(eav, eav::ATTR_ID)?
        .as_any()
        .downcast_ref::<Int16Array>()
        .ok_or_else(|| Error::Invariant("eav attr_id column is not smallint".into()))?;
    let indices = column(eav, eav::ARRAY_INDICES)?
        .as_any()
        .downcast_ref::<StringArray>()
        .ok_or_else(|| Error::Invariant("eav array_indices column is not text".into()))?;
    let mut gathers: Vec<Gather> = attrs
        .order
        .iter()
        .map(|(_, shape)| match shape {
            Shape::Scalar(_) => Gather::Scalar(vec![None; n]),
            Shape::List(_) => Gather::List {
                present: vec![false; n],
                items: Vec::new(),
            },
        })
        .collect();
    // EAV rows mostly come in row-id order, so the row of the previous EAV row (or the next
    // one) is tried before a binary search.
    let mut hint = 0;
    for (e, id) in eav_ids.value_data().chunks_exact(16).enumerate() {
        let Some(slot) = attrs.slot_of(attr_ids.value(e)) else {
            continue; // not an attribute of this schema: the pivot ignores it too
        };
        let k = key(id);
        let at = if keys.get(hint) == Some(&k) {
            hint
        } else if keys.get(hint + 1) == Some(&k) {
            hint + 1
        } else {
            match keys.binary_search(&k) {
                Ok(at) => at,
                Err(_) => continue, // no row of the export: the LEFT JOIN drops it
            }
        };
        hint = at;
        let e32 = index(e)?;
        match &mut gathers[slot] {
            Gather::Scalar(picks) => {
                if picks[at].replace(e32).is_some() {
                    return Ok(None);
                }
            }
            Gather::List { present, items } => {
                present[at] = true;
                // The empty-list marker: the database's empty index, read as NULL (the pivot's
                // `array_indices <> ''` leaves both out alike).
                let text = match indices.is_null(e) {
                    true => "",
                    false => indices.value(e),
                };
                if text.is_empty() {
                    continue;
                }
                match plain_index(text) {
                    Some(i) => items.push((at, i, e32)),
                    None => return Ok(None),
                }
            }
        }
    }
    let mut out = Vec::with_capacity(attrs.order.len());
    for ((id, shape), gather) in attrs.order.iter().zip(gathers) {
        let values = column(eav, shape.column())?;
        let gathered = match gather {
            Gather::Scalar(picks) => take(values.as_ref(), &UInt32Array::from(picks), None)
                .map_err(Error::arrow(format!("gather eav attribute {id}")))?,
            Gather::List { present, items } => match list(values, present, items)? {
                Some(list) => list,
                None => return Ok(None),
            },
        };
        let field = Field::new(raw_column(*id), gathered.data_type().clone(), true);
        out.push((field, gathered));
    }
    Ok(Some(out))
}

/// One attribute's EAV rows found for the export's rows.
enum Gather {
    /// The EAV row of each row, if any.
    Scalar(Vec<Option<u32>>),
    /// Which rows have any row of the attribute, and its items as (row, index, EAV row).
    List {
        present: Vec<bool>,
        items: Vec<(usize, i64, u32)>,
    },
}

/// The list column of one attribute: per row its items from `values` in index order, `[]`
/// for a row with only the empty-list marker, NULL for a row with none. `None` when two items
/// of one row share an index.
fn list(
    values: &ArrayRef,
    present: Vec<bool>,
    mut items: Vec<(usize, i64, u32)>,
) -> Result<Option<ArrayRef>> {
    items.sort_unstable_by_key(|&(at, i, _)| (at, i));
    if items
        .windows(2)
        .any(|w| (w[0].0, w[0].1) == (w[1].0, w[1].1))
    {
        return Ok(None);
    }
    let picks: UInt32Array = items.iter().map(|&(_, _, e)| Some(e)).collect();
    let flat = take(values.as_ref(), &picks, None).map_err(Error::arrow("gather list items"))?;
    let mut lengths = vec![0usize; present.len()];
    for &(at, _, _) in &items {
        lengths[at] += 1;
    }
    let field = Arc::new(Field::new("item", values.data_type().clone(), true));
    ListArray::try_new(
        field,
        OffsetBuffer::from_lengths(lengths),
        flat,
        Some(NullBuffer::from(present)),
    )
    .map(|l| Some(Arc::new(l) as ArrayRef))
    .map_err(Error::arrow("build list column"))
}

/// A row position as a `take` index.
fn index(i: usize) -> Result<u32> {
    u32::try_from(i).map_err(|_| Error::Invariant("too many rows for one export".into()))
}

/// Row ids as big-endian integers: their order is the byte order PostgreSQL and DuckDB sort
/// UUIDs by.
fn keys(ids: &FixedSizeBinaryArray) -> Vec<u128> {
    ids.value_data().chunks_exact(16).map(key).collect()
}

/// A 16-byte row id as an integer (ids come from 16-byte chunks, so never anything else).
fn key(id: &[u8]) -> u128 {
    <[u8; 16]>::try_from(id).map_or(0, u128::from_be_bytes)
}

/// The column of `batch` named `name`.
fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch
        .column_by_name(name)
        .ok_or_else(|| Error::Invariant(format!("eav page has no {name} column")))
}

/// The first column of `batch` (`row_id` or `ltbase_row_id`) as 16-byte row ids.
fn ids(batch: &RecordBatch) -> Result<&FixedSizeBinaryArray> {
    batch
        .column(0)
        .as_any()
        .downcast_ref::<FixedSizeBinaryArray>()
        .ok_or_else(|| Error::Invariant("row id column is not 16-byte binary".into()))
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, Float64Array, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Float64Type};

    use super::*;
    use crate::schema::Attribute;

    #[test]
    fn a_plain_index_is_an_integer_written_as_it_prints() {
        let cases = [
            "0",
            "1",
            "-1",
            "42",
            "-42",
            "10",
            "007",
            "00",
            "-0",
            "-07",
            "+1",
            "1.0",
            "1e2",
            " 1",
            "1 ",
            "-",
            "",
            "--1",
            "9223372036854775807",
            "-9223372036854775808",
            "9223372036854775808",
            "١",
        ];
        for text in cases {
            let printed = text.parse::<i64>().ok().filter(|i| i.to_string() == text);
            assert_eq!(plain_index(text), printed, "{text:?}");
        }
    }

    fn schema() -> SchemaDef {
        let attr = |id: i16, value_type, items_type| Attribute {
            name: format!("a{id}"),
            id,
            value_type,
            items_type,
            binding: None,
            column: format!("a{id}"),
        };
        SchemaDef {
            name: "t".into(),
            attributes: vec![
                attr(7, ValueType::List, Some(ValueType::Text)),
                attr(8, ValueType::Numeric, None),
            ],
        }
    }

    /// A batch of 16-byte ids (column 0) and an Int64 `n` per row.
    fn keyed(name: &str, rows: &[(u128, i64)]) -> RecordBatch {
        let ids: Vec<[u8; 16]> = rows.iter().map(|r| r.0.to_be_bytes()).collect();
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new(name, DataType::FixedSizeBinary(16), false),
                Field::new(format!("{name}_n"), DataType::Int64, false),
            ])),
            vec![
                Arc::new(FixedSizeBinaryArray::try_from_iter(ids.iter()).unwrap()),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap()
    }

    #[test]
    fn each_slot_gets_its_entity_row_in_row_id_order_whatever_order_either_came_in() {
        let schema = SchemaDef {
            name: "t".into(),
            attributes: Vec::new(),
        };
        let slots = keyed("row_id", &[(30, 3), (10, 1), (20, 2), (50, 5)]);
        // Unsorted entity rows; 90 is no slot's (dropped), 30 has none (a hard delete: NULL).
        let entities = keyed(
            "ltbase_row_id",
            &[(50, 500), (20, 200), (90, 900), (10, 100)],
        );
        // An EAV row of no attribute of the schema: ignored.
        let none = eav(&[(10, 99, Some(""), Some("x"), None)]);
        let rows = assemble_slots(&schema, &slots, &entities, &none)
            .unwrap()
            .unwrap();
        let n = |c: &str| -> Vec<Option<i64>> {
            rows.column_by_name(c)
                .unwrap()
                .as_primitive::<arrow::datatypes::Int64Type>()
                .iter()
                .collect()
        };
        assert_eq!(n("row_id_n"), [Some(1), Some(2), Some(3), Some(5)]);
        assert_eq!(
            n("ltbase_row_id_n"),
            [Some(100), Some(200), None, Some(500)]
        );
        // Sorted entity rows give the same.
        let sorted = keyed(
            "ltbase_row_id",
            &[(10, 100), (20, 200), (50, 500), (90, 900)],
        );
        let again = assemble_slots(&schema, &slots, &sorted, &none)
            .unwrap()
            .unwrap();
        assert_eq!(again, rows);
        // Two entity rows, or two slots, of one id: only the pivot defines the result.
        let twice = keyed("ltbase_row_id", &[(20, 200), (10, 100), (20, 201)]);
        assert!(
            assemble_slots(&schema, &slots, &twice, &none)
                .unwrap()
                .is_none()
        );
        let two_slots = keyed("row_id", &[(10, 1), (10, 2)]);
        assert!(
            assemble_slots(&schema, &two_slots, &sorted, &none)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn an_attribute_is_found_by_its_id_whatever_the_ids_range() {
        let attr = |id: i16| Attribute {
            name: format!("a{id}"),
            id,
            value_type: ValueType::Text,
            items_type: None,
            binding: None,
            column: format!("a{id}"),
        };
        let of = |ids: &[i16]| {
            Attributes::of(&SchemaDef {
                name: "t".into(),
                attributes: ids.iter().map(|&id| attr(id)).collect(),
            })
        };
        let a = of(&[9, -3, i16::MAX, 4]);
        let found: Vec<Option<usize>> = [9, -3, i16::MAX, 4, 5, -4, i16::MIN, 0]
            .iter()
            .map(|&id| a.slot_of(id))
            .collect();
        assert_eq!(
            found,
            [Some(0), Some(1), Some(2), Some(3), None, None, None, None]
        );
        let extremes = of(&[i16::MIN, i16::MAX]);
        assert_eq!(
            (
                extremes.slot_of(i16::MIN),
                extremes.slot_of(i16::MAX),
                extremes.slot_of(0)
            ),
            (Some(0), Some(1), None)
        );
        assert_eq!(of(&[]).slot_of(0), None);
    }

    /// An EAV row: `(row key, attr_id, array_indices, value_text, value_numeric)`.
    type EavRow<'a> = (u128, i16, Option<&'a str>, Option<&'a str>, Option<f64>);

    fn eav(rows: &[EavRow]) -> RecordBatch {
        let ids: Vec<[u8; 16]> = rows.iter().map(|r| r.0.to_be_bytes()).collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(FixedSizeBinaryArray::try_from_iter(ids.iter()).unwrap()),
            Arc::new(Int16Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.2))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.3))),
            Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.4))),
        ];
        let fields = vec![
            Field::new("row_id", DataType::FixedSizeBinary(16), false),
            Field::new("attr_id", DataType::Int16, false),
            Field::new("array_indices", DataType::Utf8, true),
            Field::new("value_text", DataType::Utf8, true),
            Field::new("value_numeric", DataType::Float64, true),
        ];
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    }

    fn gather(rows: &[EavRow]) -> Option<Vec<ArrayRef>> {
        gather_eav(&Attributes::of(&schema()), &eav(rows), &[1, 2, 3])
            .unwrap()
            .map(|cols| cols.into_iter().map(|(_, c)| c).collect())
    }

    #[test]
    fn list_items_come_in_numeric_index_order_and_the_marker_alone_is_empty() {
        let cols = gather(&[
            (1, 7, Some("10"), Some("ten"), None),
            (1, 7, Some(""), None, None), // marker next to items: the items win
            (1, 7, Some("2"), Some("two"), None),
            (1, 7, Some("-1"), Some("minus one"), None),
            (2, 7, Some(""), None, None),
            (3, 8, Some(""), None, Some(2.5)),
            (4, 7, Some("0"), Some("not in the export"), None),
            (1, 99, Some(""), Some("not in the schema"), None),
        ])
        .expect("joined");
        let lists = cols[0].as_list::<i32>();
        let items = |row: usize| -> Vec<Option<String>> {
            lists
                .value(row)
                .as_string::<i32>()
                .iter()
                .map(|v| v.map(str::to_string))
                .collect()
        };
        assert_eq!(
            items(0),
            [
                Some("minus one".into()),
                Some("two".into()),
                Some("ten".into())
            ]
        );
        assert!(
            lists.is_valid(1) && items(1).is_empty(),
            "[] for the marker"
        );
        assert!(lists.is_null(2), "NULL without rows");
        let scalars = cols[1].as_primitive::<Float64Type>();
        assert_eq!(
            (scalars.is_null(0), scalars.is_null(1), scalars.value(2)),
            (true, true, 2.5)
        );
    }

    #[test]
    fn a_null_index_is_the_empty_list_marker() {
        // The reader sends the empty index as NULL (`source::live::eav_select`).
        let with = |marker: Option<&'static str>| {
            gather(&[
                (1, 7, marker, None, None),
                (2, 7, Some("0"), Some("zero"), None),
                (2, 7, marker, None, None),
                (3, 8, marker, None, Some(2.5)),
            ])
            .expect("joined")
        };
        let (null, empty) = (with(None), with(Some("")));
        assert_eq!(null.len(), 2);
        for (n, e) in null.iter().zip(&empty) {
            assert_eq!(n.to_data(), e.to_data());
        }
        let lists = null[0].as_list::<i32>();
        assert!(
            lists.is_valid(0) && lists.value(0).is_empty(),
            "[] for the marker"
        );
        assert_eq!(lists.value(1).as_string::<i32>().value(0), "zero");
        assert!(lists.is_null(2), "NULL without rows");
        assert_eq!(null[1].as_primitive::<Float64Type>().value(2), 2.5);
    }

    #[test]
    fn what_only_the_pivot_defines_is_declined() {
        for index in [Some("01"), Some("+1"), Some("-0"), Some(" 1"), Some("x")] {
            assert!(
                gather(&[(1, 7, index, Some("v"), None)]).is_none(),
                "index {index:?}"
            );
        }
        let repeated = [
            (1, 7, Some("1"), Some("a"), None),
            (1, 7, Some("1"), Some("b"), None),
        ];
        assert!(gather(&repeated).is_none(), "two items at one index");
        let twice = [
            (3, 8, Some(""), None, Some(1.0)),
            (3, 8, Some(""), None, Some(2.0)),
        ];
        assert!(gather(&twice).is_none(), "two rows of one scalar");
        assert!(gather(&[(1, 7, Some("1"), Some("a"), None)]).is_some());
    }
}
