//! Writes a query's result, batch by batch, in the format asked for: an aligned table (for a
//! terminal; the only format held whole, to size its columns), CSV (RFC 4180, a header row,
//! NULL as an empty field, lists and structs as JSON text), JSON (one array of objects),
//! NDJSON (one object per line); Parquet is written by DuckDB itself ([`parquet_via`]). A file is written under a temporary name
//! beside it and renamed when complete, so a failed query never leaves half an export.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::error::{Error, Result};

/// How a result is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// An aligned table.
    Table,
    /// Comma-separated values with a header row.
    Csv,
    /// A JSON array of objects.
    Json,
    /// One JSON object per line.
    Ndjson,
    /// A Parquet file.
    Parquet,
}

impl Format {
    /// Every format's name.
    pub const NAMES: &'static str = "table, csv, json, ndjson, parquet";

    /// The format named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "table" => Self::Table,
            "csv" => Self::Csv,
            "json" => Self::Json,
            "ndjson" | "jsonl" => Self::Ndjson,
            "parquet" => Self::Parquet,
            _ => return None,
        })
    }

    /// The format an output file's extension implies.
    pub fn of_path(path: &Path) -> Option<Self> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        Self::parse(match ext.as_str() {
            "txt" => "table",
            "parq" => "parquet",
            other => other,
        })
    }
}

/// Where a result goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// Standard output.
    Stdout,
    /// A file, replaced whole when the query succeeds.
    File(PathBuf),
}

/// The open output.
pub(crate) struct Output {
    format: Format,
    sink: Option<Sink>,
    target: Option<(PathBuf, PathBuf)>,
    table: Vec<RecordBatch>,
    rows: u64,
    first: bool,
}

/// The bytes' way out: a buffered file or standard output.
enum Sink {
    File(BufWriter<File>),
    Stdout(BufWriter<io::Stdout>),
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::File(w) => w.write(buf),
            Sink::Stdout(w) => w.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::File(w) => w.flush(),
            Sink::Stdout(w) => w.flush(),
        }
    }
}

fn write_err(path: Option<&Path>) -> impl FnOnce(io::Error) -> Error {
    let path = path.map_or_else(|| PathBuf::from("<stdout>"), Path::to_path_buf);
    move |source| Error::Io {
        op: "write the query result to",
        path,
        source,
    }
}

impl Output {
    /// Opens `dest` for a result in `format`.
    pub(crate) fn open(dest: &Destination, format: Format) -> Result<Self> {
        let (sink, target) = match dest {
            Destination::Stdout => (Sink::Stdout(BufWriter::new(io::stdout())), None),
            Destination::File(path) => {
                let tmp = temp_beside(path);
                let file = File::options()
                    .write(true)
                    .create_new(true)
                    .open(&tmp)
                    .map_err(|source| Error::Io {
                        op: "create the query output",
                        path: tmp.clone(),
                        source,
                    })?;
                (Sink::File(BufWriter::new(file)), Some((tmp, path.clone())))
            }
        };
        Ok(Self {
            format,
            sink: Some(sink),
            target,
            table: Vec::new(),
            rows: 0,
            first: true,
        })
    }

    fn path(&self) -> Option<&Path> {
        self.target.as_ref().map(|(_, p)| p.as_path())
    }

    /// The sink, while the output is open.
    fn sink(&mut self) -> io::Result<&mut Sink> {
        self.sink
            .as_mut()
            .ok_or_else(|| io::Error::other("the output was closed"))
    }

    /// Writes `bytes` to the sink.
    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        let path = self.path().map(Path::to_path_buf);
        self.sink()
            .and_then(|s| s.write_all(bytes))
            .map_err(write_err(path.as_deref()))
    }

    /// Writes one batch.
    pub(crate) fn batch(&mut self, batch: &RecordBatch) -> Result<()> {
        self.rows += batch.num_rows() as u64;
        let path = self.path().map(Path::to_path_buf);
        let werr = || write_err(path.as_deref());
        match self.format {
            Format::Table => self.table.push(as_text_cells(batch)?),
            Format::Csv => {
                let batch = &as_text_cells(batch)?;
                if self.first {
                    let names: Vec<String> = batch
                        .schema()
                        .fields()
                        .iter()
                        .map(|f| csv_field(f.name()))
                        .collect();
                    self.put(format!("{}\n", names.join(",")).as_bytes())?;
                }
                let sink = self.sink().map_err(werr())?;
                write_csv(sink, batch).map_err(|e| match e {
                    CsvError::Io(e) => werr()(e),
                    CsvError::Arrow(e) => Error::arrow("format a value")(e),
                })?;
            }
            Format::Json | Format::Ndjson => {
                let mut buf = Vec::new();
                {
                    let mut w = arrow::json::WriterBuilder::new()
                        .with_explicit_nulls(true)
                        .build::<_, arrow::json::writer::LineDelimited>(&mut buf);
                    w.write(&wide_decimals(batch)?)
                        .map_err(Error::arrow("write JSON"))?;
                    w.finish().map_err(Error::arrow("write JSON"))?;
                }
                for line in buf.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                    let lead: &[u8] = match (self.format, self.first) {
                        (Format::Json, true) => b"[\n",
                        (Format::Json, false) => b",\n",
                        _ => b"",
                    };
                    self.put(lead)?;
                    self.put(line)?;
                    if self.format == Format::Ndjson {
                        self.put(b"\n")?;
                    }
                    self.first = false;
                }
                return Ok(());
            }
            Format::Parquet => {
                return Err(Error::Invariant(
                    "Parquet is written by DuckDB (parquet_via)".into(),
                ));
            }
        }
        self.first = false;
        Ok(())
    }

    /// Completes the output (`schema` is the result's, for an empty result's header); returns
    /// the rows written.
    pub(crate) fn finish(mut self, schema: SchemaRef) -> Result<u64> {
        let path = self.path().map(Path::to_path_buf);
        let werr = || write_err(path.as_deref());
        let empty = RecordBatch::new_empty(Arc::clone(&schema));
        match self.format {
            Format::Table => {
                let batches = if self.table.is_empty() {
                    vec![empty]
                } else {
                    std::mem::take(&mut self.table)
                };
                let table = arrow::util::pretty::pretty_format_batches(&batches)
                    .map_err(Error::arrow("format the result"))?
                    .to_string();
                // The table is for a terminal: a control character from the lake (an escape
                // sequence in a value) is shown, never sent (docs/hazards.md S17).
                let mut text = String::with_capacity(table.len());
                for c in table.chars() {
                    if c.is_control() && c != '\n' {
                        text.extend(c.escape_default());
                    } else {
                        text.push(c);
                    }
                }
                let rows = self.rows;
                let plural = if rows == 1 { "" } else { "s" };
                self.put(format!("{text}\n({rows} row{plural})\n").as_bytes())?;
            }
            Format::Csv if self.first => self.batch(&empty)?,
            Format::Json if self.first => self.put(b"[]\n")?,
            Format::Json => self.put(b"\n]\n")?,
            Format::Csv | Format::Ndjson | Format::Parquet => {}
        }
        let sink = self.sink().map_err(werr())?;
        sink.flush().map_err(werr())?;
        if let Sink::File(w) = sink {
            w.get_ref().sync_all().map_err(werr())?;
        }
        if let Some((tmp, path)) = self.target.take() {
            std::fs::rename(&tmp, &path).map_err(|source| Error::Io {
                op: "move the query output to",
                path,
                source,
            })?;
        }
        Ok(self.rows)
    }
}

/// A Parquet result, which DuckDB writes itself (`write` gets the path to write, and returns
/// the rows) so every type keeps its Parquet form (UUIDs, booleans, lists, as in the lake): to
/// a temporary file beside the output and renamed, or to `scratch` and then to stdout.
pub(crate) fn parquet_via(
    dest: &Destination,
    scratch: &Path,
    write: impl FnOnce(&Path) -> Result<u64>,
) -> Result<u64> {
    let tmp = match dest {
        Destination::File(path) => temp_beside(path),
        Destination::Stdout => scratch.join(format!("result-{}.parquet", uuid::Uuid::new_v4())),
    };
    let result = write(&tmp).and_then(|rows| {
        match dest {
            Destination::File(path) => {
                std::fs::rename(&tmp, path).map_err(|source| Error::Io {
                    op: "move the query output to",
                    path: path.clone(),
                    source,
                })?;
            }
            Destination::Stdout => {
                let mut file = File::open(&tmp).map_err(write_err(None))?;
                let mut out = io::stdout().lock();
                io::copy(&mut file, &mut out).map_err(write_err(None))?;
                out.flush().map_err(write_err(None))?;
            }
        }
        Ok(rows)
    });
    let _ = std::fs::remove_file(&tmp);
    result
}

/// A fresh hidden name beside `path`.
fn temp_beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(
        ".{name}.lakecdc-{}.tmp",
        uuid::Uuid::new_v4().simple()
    ))
}

impl Drop for Output {
    fn drop(&mut self) {
        // Not finished: the partial file is removed, the target left as it was.
        if let Some((tmp, _)) = self.target.take() {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// `batch` with what a text cell cannot show as Arrow's display writes it made text: a
/// nested value (list, struct, map) as its JSON, so an empty list, a list of one empty string
/// and a list of one NULL stay apart (`[]`, `[""]`, `[null]`) and an element holding a comma
/// stays one element; a whole number of 128 bits (DuckDB's HUGEINT, a `Decimal128` of scale
/// 0) in all its digits. A NULL stays NULL.
fn as_text_cells(batch: &RecordBatch) -> Result<RecordBatch> {
    use arrow::array::{Array, ArrayRef, Decimal128Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    let nested = |t: &DataType| t.is_nested();
    let huge = |t: &DataType| matches!(t, DataType::Decimal128(_, 0));
    let schema = batch.schema();
    if !schema
        .fields()
        .iter()
        .any(|f| nested(f.data_type()) || huge(f.data_type()))
    {
        return Ok(batch.clone());
    }
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(fields.capacity());
    for (f, c) in schema.fields().iter().zip(batch.columns()) {
        let text: Option<StringArray> = if huge(f.data_type()) {
            c.as_any()
                .downcast_ref::<Decimal128Array>()
                .map(|d| d.iter().map(|v| v.map(|v| v.to_string())).collect())
        } else if nested(f.data_type()) {
            Some(json_cells(c)?)
        } else {
            None
        };
        match text {
            Some(t) => {
                fields.push(Field::new(f.name(), DataType::Utf8, true));
                columns.push(Arc::new(t));
            }
            None => {
                fields.push(f.as_ref().clone());
                columns.push(Arc::clone(c));
            }
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(Error::arrow("format a value"))
}

/// Each value of the nested column `c` as JSON text (the JSON output's encoding); NULL as NULL.
fn json_cells(c: &arrow::array::ArrayRef) -> Result<arrow::array::StringArray> {
    use arrow::array::Array;
    use arrow::datatypes::{Field, Schema};
    let one = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new(
            "v",
            c.data_type().clone(),
            true,
        )])),
        vec![Arc::clone(c)],
    )
    .map_err(Error::arrow("format a value"))?;
    let one = wide_decimals(&one)?;
    let mut buf = Vec::new();
    {
        let mut w = arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, arrow::json::writer::LineDelimited>(&mut buf);
        w.write(&one).map_err(Error::arrow("format a value"))?;
        w.finish().map_err(Error::arrow("format a value"))?;
    }
    let mut cells = Vec::with_capacity(c.len());
    for (row, line) in buf
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .enumerate()
    {
        // `{"v":<value>}`: the value's text is taken as written (parsed, a number past
        // 2^53 would come back rounded).
        let v = line
            .strip_prefix(b"{\"v\":")
            .and_then(|l| l.strip_suffix(b"}"))
            .and_then(|v| std::str::from_utf8(v).ok())
            .ok_or_else(|| {
                Error::Invariant(format!(
                    "a JSON cell of its own making: {}",
                    String::from_utf8_lossy(line)
                ))
            })?;
        cells.push((!c.is_null(row)).then(|| v.to_string()));
    }
    Ok(cells.into_iter().collect())
}

/// `batch` with every `Decimal128(p, s)`, at any depth, made a `Decimal256(76, s)`: Arrow writes
/// a decimal in at most its precision's digits, and DuckDB hands a HUGEINT over as a
/// `Decimal128(38, 0)` whose values may have 39 (the JSON output would drop the last one).
fn wide_decimals(batch: &RecordBatch) -> Result<RecordBatch> {
    use arrow::datatypes::{DataType, Field, Schema};
    fn widened(t: &DataType) -> Option<DataType> {
        let field = |f: &Field| -> Option<Field> {
            widened(f.data_type()).map(|t| f.clone().with_data_type(t))
        };
        match t {
            DataType::Decimal128(_, s) => Some(DataType::Decimal256(76, *s)),
            DataType::List(f) => field(f).map(|f| DataType::List(Arc::new(f))),
            DataType::LargeList(f) => field(f).map(|f| DataType::LargeList(Arc::new(f))),
            DataType::FixedSizeList(f, n) => {
                field(f).map(|f| DataType::FixedSizeList(Arc::new(f), *n))
            }
            DataType::Struct(fields) => {
                let wide: Vec<Option<Field>> = fields.iter().map(|f| field(f)).collect();
                wide.iter().any(Option::is_some).then(|| {
                    DataType::Struct(
                        fields
                            .iter()
                            .zip(wide)
                            .map(|(f, w)| w.unwrap_or_else(|| f.as_ref().clone()))
                            .collect(),
                    )
                })
            }
            DataType::Map(f, sorted) => field(f).map(|f| DataType::Map(Arc::new(f), *sorted)),
            _ => None,
        }
    }
    let schema = batch.schema();
    if !schema
        .fields()
        .iter()
        .any(|f| widened(f.data_type()).is_some())
    {
        return Ok(batch.clone());
    }
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns = Vec::with_capacity(fields.capacity());
    for (f, c) in schema.fields().iter().zip(batch.columns()) {
        match widened(f.data_type()) {
            Some(t) => {
                columns.push(arrow::compute::cast(c, &t).map_err(Error::arrow("widen a decimal"))?);
                fields.push(f.as_ref().clone().with_data_type(t));
            }
            None => {
                fields.push(f.as_ref().clone());
                columns.push(Arc::clone(c));
            }
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(Error::arrow("widen a decimal"))
}

enum CsvError {
    Io(io::Error),
    Arrow(arrow::error::ArrowError),
}

fn write_csv(out: &mut impl Write, batch: &RecordBatch) -> Result<(), CsvError> {
    let options = FormatOptions::default().with_null("");
    let formatters = batch
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
        .collect::<Result<Vec<_>, _>>()
        .map_err(CsvError::Arrow)?;
    let mut line = String::new();
    for row in 0..batch.num_rows() {
        line.clear();
        for (i, f) in formatters.iter().enumerate() {
            if i > 0 {
                line.push(',');
            }
            if batch.column(i).is_null(row) {
                continue;
            }
            line.push_str(&csv_field(&f.value(row).to_string()));
        }
        line.push('\n');
        out.write_all(line.as_bytes()).map_err(CsvError::Io)?;
    }
    Ok(())
}

/// A CSV field, quoted when it holds a separator, a quote, a line break or edge spaces, or is
/// empty (so an empty string differs from NULL).
fn csv_field(s: &str) -> String {
    if s.is_empty() || s.contains([',', '"', '\n', '\r']) || s.starts_with(' ') || s.ends_with(' ')
    {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![Some(1), None])),
                Arc::new(StringArray::from(vec![Some("a,\"b\""), Some("")])),
            ],
        )
        .unwrap()
    }

    fn write(format: Format, batches: &[RecordBatch]) -> String {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("out");
        let mut o = Output::open(&Destination::File(path.clone()), format).unwrap();
        for b in batches {
            o.batch(b).unwrap();
        }
        o.finish(batch().schema()).unwrap();
        let names: Vec<_> = std::fs::read_dir(t.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temp file left");
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn csv_quotes_what_needs_it_and_keeps_null_apart_from_empty() {
        assert_eq!(
            write(Format::Csv, &[batch()]),
            "id,name\n1,\"a,\"\"b\"\"\"\n,\"\"\n"
        );
        assert_eq!(write(Format::Csv, &[]), "id,name\n");
    }

    #[test]
    fn json_is_one_array_and_ndjson_one_object_per_line() {
        let json = write(Format::Json, &[batch(), batch()]);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v.as_array().unwrap().len(), 4);
        assert_eq!(v[1]["id"], serde_json::Value::Null);
        assert_eq!(write(Format::Json, &[]), "[]\n");
        let nd = write(Format::Ndjson, &[batch()]);
        assert_eq!(nd.lines().count(), 2);
    }

    #[test]
    fn a_table_shows_control_characters_instead_of_sending_them() {
        // docs/hazards.md S17: a value that would clear the screen or retitle the terminal.
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Utf8, true)]));
        let b = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(StringArray::from(vec![Some(
                "a\u{1b}[2Jb\u{9b}c\u{7}",
            )]))],
        )
        .unwrap();
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("out");
        let mut o = Output::open(&Destination::File(path.clone()), Format::Table).unwrap();
        o.batch(&b).unwrap();
        o.finish(schema).unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(text.contains(r"a\u{1b}[2Jb\u{9b}c\u{7}"), "{text}");
    }

    #[test]
    fn lists_keep_empty_null_and_comma_apart_and_huge_integers_all_their_digits() {
        use arrow::array::{Array, Decimal128Array, ListBuilder, StringBuilder};
        let mut lists = ListBuilder::new(StringBuilder::new());
        lists.append(true); // []
        lists.values().append_value("");
        lists.append(true); // [""]
        lists.values().append_null();
        lists.append(true); // [null]
        lists.values().append_value("a, b");
        lists.append(true); // ["a, b"]
        lists.values().append_value("a");
        lists.values().append_value("b");
        lists.append(true); // ["a","b"]
        lists.append(false); // NULL
        let lists = lists.finish();
        let big = 10i128.pow(38);
        let huge = Decimal128Array::from(vec![
            Some(big),
            Some(-big - 1),
            None,
            Some(7),
            Some(0),
            None,
        ])
        .with_precision_and_scale(38, 0)
        .unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("l", lists.data_type().clone(), true),
            Field::new("h", DataType::Decimal128(38, 0), true),
        ]));
        let b =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(lists), Arc::new(huge)]).unwrap();
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("out.csv");
        let mut o = Output::open(&Destination::File(path.clone()), Format::Csv).unwrap();
        o.batch(&b).unwrap();
        o.finish(schema.clone()).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!(
                "l,h\n[],{big}\n\"[\"\"\"\"]\",-{}\n[null],\n\"[\"\"a, b\"\"]\",7\n\"[\"\"a\"\",\"\"b\"\"]\",0\n,\n",
                big + 1
            )
        );
        let path = t.path().join("out.txt");
        let mut o = Output::open(&Destination::File(path.clone()), Format::Table).unwrap();
        o.batch(&b).unwrap();
        o.finish(schema).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        for cell in [
            "| []",
            "[\"\"]",
            "[null]",
            "[\"a, b\"]",
            "[\"a\",\"b\"]",
            &big.to_string(),
        ] {
            assert!(text.contains(cell), "{cell}: {text}");
        }
    }

    #[test]
    fn json_writes_a_huge_integer_in_all_its_digits_at_any_depth() {
        use arrow::array::{Array, Decimal128Builder, ListBuilder};
        let huge = [i128::MAX, i128::MIN, 10i128.pow(38), 7];
        let top = arrow::array::Decimal128Array::from(huge.to_vec())
            .with_precision_and_scale(38, 0)
            .unwrap();
        let mut lists =
            ListBuilder::new(Decimal128Builder::new().with_data_type(DataType::Decimal128(38, 0)));
        for v in huge {
            lists.values().append_value(v);
            lists.values().append_null();
            lists.append(true);
        }
        let lists = lists.finish();
        let scaled = arrow::array::Decimal128Array::from(vec![12345, -5, 0, 100])
            .with_precision_and_scale(9, 2)
            .unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("h", DataType::Decimal128(38, 0), true),
            Field::new("l", lists.data_type().clone(), true),
            Field::new("d", DataType::Decimal128(9, 2), true),
        ]));
        let b = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(top), Arc::new(lists), Arc::new(scaled)],
        )
        .unwrap();
        let text = write(Format::Ndjson, std::slice::from_ref(&b));
        let want: Vec<String> = huge
            .iter()
            .zip(["123.45", "-0.05", "0.00", "1.00"])
            .map(|(v, d)| format!("{{\"h\":{v},\"l\":[{v},null],\"d\":{d}}}"))
            .collect();
        assert_eq!(text.lines().collect::<Vec<_>>(), want);
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("out.csv");
        let mut o = Output::open(&Destination::File(path.clone()), Format::Csv).unwrap();
        o.batch(&b).unwrap();
        o.finish(schema).unwrap();
        let csv = std::fs::read_to_string(&path).unwrap();
        assert!(
            csv.contains(&format!("{},\"[{},null]\",123.45", i128::MAX, i128::MAX)),
            "{csv}"
        );
    }

    #[test]
    fn an_unfinished_file_output_leaves_nothing() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("out.csv");
        let mut o = Output::open(&Destination::File(path.clone()), Format::Csv).unwrap();
        o.batch(&batch()).unwrap();
        drop(o);
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0);
    }
}
