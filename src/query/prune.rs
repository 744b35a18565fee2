//! What a query's SQL says about the lake before DuckDB runs it (docs/design.md §4.8): which
//! views it names, and the `row_id` values it pins, so only the files whose manifest range can
//! hold them are fetched.
//!
//! This is a recogniser, not a parser: it answers only for the shapes it can prove and says
//! "don't know" for everything else, which costs downloads, never rows. A pin is trusted only
//! when the SQL is one `SELECT … FROM <view> [alias] WHERE …` with no other `SELECT`, `FROM`,
//! join or set operation (so nothing else in the query can see the view's other rows) and a
//! top-level `AND` conjunct of the `WHERE` (no top-level `OR`, `BETWEEN` or `CASE`) is exactly
//! `row_id = '<uuid>'`, `'<uuid>' = row_id` or `row_id IN ('<uuid>', …)`.

use std::collections::BTreeSet;

use uuid::Uuid;

/// One lexical token.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// An unquoted word (identifier or keyword), lowercased: DuckDB matches identifiers
    /// without regard to case.
    Word(String),
    /// A double-quoted identifier, lowercased.
    Quoted(String),
    /// A single-quoted string literal's value.
    Str(String),
    /// A number.
    Number,
    /// Punctuation or an operator.
    Punct(&'static str),
}

/// Splits `sql` into tokens; `None` on anything this tokenizer does not know (dollar quoting,
/// prefixed strings, whitespace other than DuckDB's six, a number run into a word, unknown
/// characters). Where DuckDB's lexer and this one could split the text differently, the
/// answer is `None`: a token this one saw whole must be one DuckDB sees whole.
fn tokens(sql: &str) -> Option<Vec<Token>> {
    lex(sql).map(|(tokens, _)| tokens)
}

/// [`tokens`], with the byte offset where each token ends.
fn lex(sql: &str) -> Option<(Vec<Token>, Vec<usize>)> {
    const PUNCT: [&str; 21] = [
        "::", "<=", ">=", "<>", "!=", "||", "(", ")", ",", ";", "=", "<", ">", "*", "+", "-", "/",
        "%", ".", "[", "]",
    ];
    let mut out = Vec::new();
    let mut ends = Vec::new();
    let mut rest = sql;
    while let Some(c) = rest.chars().next() {
        if ends.len() < out.len() {
            ends.push(sql.len() - rest.len());
        }
        if [' ', '\t', '\n', '\r', '\x0b', '\x0c'].contains(&c) {
            rest = &rest[1..];
        } else if rest.starts_with("--") {
            // DuckDB ends a line comment at a carriage return as at a newline.
            rest = rest.find(['\n', '\r']).map_or("", |i| &rest[i..]);
        } else if rest.starts_with("/*") {
            rest = after_block_comment(rest)?;
        } else if c == '\'' || c == '"' {
            let (value, tail) = quoted(rest, c)?;
            out.push(if c == '\'' {
                Token::Str(value)
            } else {
                Token::Quoted(value.to_lowercase())
            });
            rest = tail;
        } else if c.is_ascii_digit() {
            rest = after_number(rest)?;
            out.push(Token::Number);
        } else if c.is_alphabetic() || c == '_' {
            let end = rest
                .find(|ch: char| !(ch.is_alphanumeric() || ch == '_'))
                .unwrap_or(rest.len());
            if rest[end..].starts_with('\'') {
                // A prefixed string (`E'…'` takes backslash escapes, `X'…'`, `B'…'`): its
                // end is not where a plain string's would be.
                return None;
            }
            out.push(Token::Word(rest[..end].to_lowercase()));
            rest = &rest[end..];
        } else {
            let p = PUNCT.iter().find(|p| rest.starts_with(**p))?;
            out.push(Token::Punct(p));
            rest = &rest[p.len()..];
        }
    }
    if ends.len() < out.len() {
        ends.push(sql.len());
    }
    Some((out, ends))
}

/// What a query's text holds, as far as statements go.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Statements<'a> {
    /// One statement: the text up to its last token (the `;`, blanks and comments after it
    /// left out, so the text can be wrapped).
    One(&'a str),
    /// Nothing but blanks, comments and semicolons.
    None,
    /// More than one statement.
    Many,
    /// Text this tokenizer does not know: DuckDB's parser judges it (wrapped, more than one
    /// statement is a syntax error there).
    Unknown(&'a str),
}

/// The statement's first word (lowercased) when `sql` can be tokenized and starts with one.
pub(crate) fn first_word(sql: &str) -> Option<String> {
    match tokens(sql)?.into_iter().next()? {
        Token::Word(w) => Some(w),
        _ => None,
    }
}

/// How many statements `sql` holds (docs/hazards.md R12).
pub(crate) fn statements(sql: &str) -> Statements<'_> {
    let Some((tokens, ends)) = lex(sql) else {
        return Statements::Unknown(sql.trim_end().trim_end_matches(';'));
    };
    let semi = Token::Punct(";");
    let Some(last) = tokens.iter().rposition(|t| *t != semi) else {
        return Statements::None;
    };
    if tokens[..last].contains(&semi) {
        return Statements::Many;
    }
    Statements::One(&sql[..ends[last]])
}

/// What follows the decimal number at the start of `s` (`12`, `1_000`, `1.5`, `2e-3`); `None`
/// when a letter, digit, `_` or `.` follows it: DuckDB reads `1OR` as `1` then `OR`, and other
/// forms (`0x1F`) are not worth telling apart from that.
fn after_number(s: &str) -> Option<&str> {
    fn digits(s: &str) -> Option<&str> {
        let end = s
            .find(|ch: char| !(ch.is_ascii_digit() || ch == '_'))
            .unwrap_or(s.len());
        (end > 0).then(|| &s[end..])
    }
    let mut rest = digits(s)?;
    if let Some(frac) = rest.strip_prefix('.') {
        rest = digits(frac).unwrap_or(frac);
    }
    if let Some(exp) = rest.strip_prefix(['e', 'E']) {
        rest = digits(exp.strip_prefix(['+', '-']).unwrap_or(exp))?;
    }
    match rest.chars().next() {
        Some(ch) if ch.is_alphanumeric() || ch == '_' || ch == '.' => None,
        _ => Some(rest),
    }
}

/// What follows the block comment at the start of `s`; block comments nest, as in DuckDB
/// (`/* a /* b */ c */` is one comment).
fn after_block_comment(s: &str) -> Option<&str> {
    let mut depth = 0usize;
    let mut i = 0;
    let bytes = s.as_bytes();
    while i + 1 < bytes.len() {
        match &bytes[i..i + 2] {
            b"/*" => {
                depth += 1;
                i += 2;
            }
            b"*/" => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return Some(&s[i..]);
                }
            }
            _ => i += 1,
        }
    }
    None
}

/// The value of the quoted token at the start of `s` (doubled quotes are one) and the rest.
fn quoted(s: &str, q: char) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = s.char_indices().skip(1).peekable();
    while let Some((i, c)) = chars.next() {
        if c == q {
            if chars.peek().is_some_and(|(_, n)| *n == q) {
                value.push(q);
                chars.next();
            } else {
                return Some((value, &s[i + 1..]));
            }
        } else {
            value.push(c);
        }
    }
    None
}

/// The reserved keywords of DuckDB's (PostgreSQL's) grammar: never an unquoted identifier, so
/// `ORDER BY` does not name a schema called `order`.
const RESERVED: [&str; 67] = [
    "all",
    "analyse",
    "analyze",
    "and",
    "any",
    "array",
    "as",
    "asc",
    "asymmetric",
    "both",
    "case",
    "cast",
    "check",
    "collate",
    "column",
    "constraint",
    "create",
    "default",
    "deferrable",
    "desc",
    "distinct",
    "do",
    "else",
    "end",
    "except",
    "false",
    "fetch",
    "for",
    "foreign",
    "from",
    "grant",
    "group",
    "having",
    "in",
    "initially",
    "intersect",
    "into",
    "lateral",
    "leading",
    "limit",
    "not",
    "null",
    "offset",
    "on",
    "only",
    "or",
    "order",
    "placing",
    "primary",
    "references",
    "returning",
    "select",
    "some",
    "symmetric",
    "table",
    "then",
    "to",
    "trailing",
    "true",
    "union",
    "unique",
    "using",
    "variadic",
    "when",
    "where",
    "window",
    "with",
];

/// The names (lowercased) among `candidates` that `sql` mentions as an identifier; `None` when
/// the SQL cannot be tokenized (then every view is needed).
pub(crate) fn named_views(sql: &str, candidates: &[String]) -> Option<BTreeSet<String>> {
    let toks = tokens(sql)?;
    let mut found = BTreeSet::new();
    for t in &toks {
        let w = match t {
            // A reserved word unquoted is the keyword: a view named `order` is `"order"`.
            Token::Word(w) if RESERVED.contains(&w.as_str()) => continue,
            Token::Word(w) | Token::Quoted(w) => w,
            _ => continue,
        };
        for c in candidates {
            let c = c.to_lowercase();
            if *w == c || *w == format!("{c}__history") {
                found.insert(c);
            }
        }
    }
    Some(found)
}

/// The `row_id` pin of a query: the one view it reads (lowercased, as written: a schema's name
/// or its `__history`) and the only ids it can observe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pin {
    /// The view, lowercased.
    pub(crate) view: String,
    /// The ids the query can see; no other row of the view can reach its result.
    pub(crate) ids: BTreeSet<Uuid>,
}

const CLAUSE_END: [&str; 8] = [
    "group", "order", "limit", "having", "qualify", "window", "offset", "fetch",
];
const NOT_ALONE: [&str; 15] = [
    // Each reads a relation without a `SELECT` or `FROM` of its own (`EXISTS (TABLE t)`).
    "table",
    "summarize",
    "describe",
    "show",
    "join",
    "union",
    "intersect",
    "except",
    "with",
    "lateral",
    "using",
    "pivot",
    "unpivot",
    "recursive",
    "natural",
];

/// The pin of `sql`, when it provably has one (see the module doc); `None` otherwise.
pub(crate) fn row_id_pin(sql: &str) -> Option<Pin> {
    let mut toks = tokens(sql)?;
    while toks.last() == Some(&Token::Punct(";")) {
        toks.pop();
    }
    let word = |t: &Token, w: &str| matches!(t, Token::Word(x) if x == w);
    let count = |w: &str| toks.iter().filter(|t| word(t, w)).count();
    if count("select") > 1
        || count("from") != 1
        || toks.contains(&Token::Punct(";"))
        || NOT_ALONE.iter().any(|w| count(w) > 0)
    {
        return None;
    }
    let from = toks.iter().position(|t| word(t, "from"))?;
    let (view, mut at) = match toks.get(from + 1)? {
        Token::Word(v) | Token::Quoted(v) => (v.clone(), from + 2),
        _ => return None,
    };
    let mut names = vec![view.clone()];
    if toks.get(at).is_some_and(|t| word(t, "as")) {
        at += 1;
    }
    match toks.get(at)? {
        Token::Word(w) if w == "where" => {}
        Token::Word(alias) | Token::Quoted(alias) => {
            names.push(alias.clone());
            at += 1;
        }
        _ => return None,
    }
    if !toks.get(at).is_some_and(|t| word(t, "where")) {
        return None;
    }
    // The WHERE clause, to its end at depth 0.
    let mut depth = 0i32;
    let mut conjuncts: Vec<Vec<Token>> = vec![Vec::new()];
    for t in &toks[at + 1..] {
        match t {
            Token::Punct("(") => depth += 1,
            Token::Punct(")") => depth -= 1,
            Token::Word(w) if depth == 0 => {
                if CLAUSE_END.contains(&w.as_str()) {
                    break;
                }
                if ["or", "between", "case"].contains(&w.as_str()) {
                    return None;
                }
                if w == "and" {
                    conjuncts.push(Vec::new());
                    continue;
                }
            }
            _ => {}
        }
        if let Some(last) = conjuncts.last_mut() {
            last.push(t.clone());
        }
    }
    let mut ids: Option<BTreeSet<Uuid>> = None;
    for c in &conjuncts {
        if let Some(found) = pinned_ids(c, &names) {
            ids = Some(match ids {
                None => found,
                Some(prev) => prev.intersection(&found).copied().collect(),
            });
        }
    }
    Some(Pin { view, ids: ids? })
}

/// The ids a conjunct pins `row_id` (of one of `names`, or unqualified) to.
fn pinned_ids(c: &[Token], names: &[String]) -> Option<BTreeSet<Uuid>> {
    let lit = |t: &Token| match t {
        Token::Str(s) => Uuid::parse_str(s).ok(),
        _ => None,
    };
    if let [value, Token::Punct("="), tail @ ..] = c
        && is_row_id(tail, names) == Some(tail.len())
    {
        return lit(value).map(|u| BTreeSet::from([u]));
    }
    let column_len = is_row_id(c, names)?;
    let rest = &c[column_len..];
    match rest {
        [Token::Punct("="), value] => lit(value).map(|u| BTreeSet::from([u])),
        [
            Token::Word(w),
            Token::Punct("("),
            inner @ ..,
            Token::Punct(")"),
        ] if w == "in" => {
            let mut ids = BTreeSet::new();
            for (i, t) in inner.iter().enumerate() {
                if i % 2 == 1 {
                    (*t == Token::Punct(",")).then_some(())?;
                } else {
                    ids.insert(lit(t)?);
                }
            }
            (!ids.is_empty()).then_some(ids)
        }
        _ => None,
    }
}

/// How many tokens `row_id` (bare or qualified by one of `names`) takes at the start of `c`.
fn is_row_id(c: &[Token], names: &[String]) -> Option<usize> {
    let ident = |t: &Token| match t {
        Token::Word(w) | Token::Quoted(w) => Some(w.clone()),
        _ => None,
    };
    match c {
        [q, Token::Punct("."), col, ..]
            if ident(col).as_deref() == Some("row_id")
                && ident(q).is_some_and(|q| names.contains(&q)) =>
        {
            Some(3)
        }
        [col, ..] if ident(col).as_deref() == Some("row_id") => Some(1),
        _ => None,
    }
}

/// Whether a file whose manifest range is `[min, max]` can hold one of `ids`. An empty or
/// unreadable range is "can": only a range the manifest states proves absence.
pub(crate) fn may_hold(min: &str, max: &str, ids: &BTreeSet<Uuid>) -> bool {
    match (Uuid::parse_str(min), Uuid::parse_str(max)) {
        (Ok(lo), Ok(hi)) => ids.range(lo..=hi).next().is_some(),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "00000000-0000-0000-0000-00000000000a";
    const B: &str = "00000000-0000-0000-0000-00000000000b";

    fn pin(sql: &str) -> Option<(String, Vec<String>)> {
        row_id_pin(sql).map(|p| (p.view, p.ids.iter().map(|u| u.to_string()).collect()))
    }

    #[test]
    fn pins_equalities_and_in_lists() {
        let want = Some(("customer".to_string(), vec![A.to_string()]));
        assert_eq!(
            pin(&format!("SELECT * FROM customer WHERE row_id = '{A}'")),
            want
        );
        assert_eq!(
            pin(&format!(
                "select name from Customer c where '{A}' = c.row_id;"
            )),
            want
        );
        assert_eq!(
            pin(&format!(
                "SELECT count(*) FROM \"customer\" AS c WHERE c.age > 3 AND (x OR y) AND customer.row_id IN ('{A}', '{B}') ORDER BY 1 LIMIT 5"
            )),
            Some(("customer".to_string(), vec![A.to_string(), B.to_string()]))
        );
        assert_eq!(
            pin(&format!(
                "SELECT * FROM customer__history WHERE row_id IN ('{A}','{B}') AND row_id = '{B}'"
            )),
            Some(("customer__history".to_string(), vec![B.to_string()]))
        );
    }

    #[test]
    fn anything_it_cannot_prove_is_no_pin() {
        for sql in [
            format!("SELECT * FROM customer WHERE row_id = '{A}' OR age > 1"),
            format!("SELECT * FROM customer WHERE NOT row_id = '{A}'"),
            format!("SELECT * FROM customer WHERE row_id <> '{A}'"),
            format!("SELECT * FROM customer WHERE row_id NOT IN ('{A}')"),
            format!("SELECT * FROM customer WHERE age BETWEEN 1 AND row_id = '{A}'"),
            format!("SELECT * FROM customer c JOIN orders o ON true WHERE o.row_id = '{A}'"),
            format!("SELECT * FROM customer, orders WHERE row_id = '{A}'"),
            format!("SELECT * FROM customer c WHERE other.row_id = '{A}'"),
            format!("SELECT *, (SELECT count(*) FROM customer) FROM customer WHERE row_id = '{A}'"),
            format!("SELECT * FROM customer WHERE row_id = '{A}' UNION SELECT * FROM customer"),
            format!("WITH c AS (SELECT 1) SELECT * FROM customer WHERE row_id = '{A}'"),
            "SELECT * FROM customer WHERE row_id = 'not-a-uuid'".to_string(),
            format!("SELECT * FROM customer WHERE row_id = '{A}' || ''"),
            format!("SELECT * FROM customer WHERE CASE WHEN true THEN row_id = '{A}' END"),
            format!("SELECT * FROM customer WHERE row_id = $${A}$$"),
            format!("SELECT 1; SELECT * FROM customer WHERE row_id = '{A}'"),
            "SELECT * FROM customer".to_string(),
            // An escape string's `\'` is not its end: DuckDB sees the `OR`.
            format!(
                "SELECT * FROM customer WHERE row_id = '{A}' AND name = E'O\\'Brien' OR name = 'x' -- it's"
            ),
            // Block comments nest: DuckDB runs `WHERE age > 3`.
            format!(
                "SELECT * FROM customer WHERE /* off: /* one id */ row_id = '{A}' AND */ age > 3"
            ),
            // DuckDB ends a line comment at a lone carriage return: it runs the `OR`.
            format!("SELECT * FROM customer WHERE row_id = '{A}' -- note\rOR true"),
            // A number run into a keyword is two tokens to DuckDB: `1` and `OR`.
            format!("SELECT * FROM customer WHERE row_id = '{A}' AND 1OR true"),
            format!("SELECT * FROM customer WHERE row_id = '{A}' AND 1.5OR true"),
            format!("SELECT * FROM customer WHERE row_id = '{A}' AND 1e5OR true"),
            // Whitespace DuckDB does not know is not skipped.
            format!("SELECT * FROM customer WHERE row_id = '{A}'\u{a0}AND x"),
            // `TABLE customer` reads the view's other rows without a SELECT or FROM.
            format!(
                "SELECT * FROM customer WHERE row_id = '{A}' AND NOT EXISTS (TABLE customer OFFSET 1)"
            ),
        ] {
            assert_eq!(row_id_pin(&sql), None, "{sql}");
        }
    }

    #[test]
    fn comments_and_strings_do_not_confuse_it() {
        assert_eq!(
            pin(&format!(
                "SELECT 'from x where' AS s -- from y\n FROM /* join */ customer WHERE row_id = '{A}'"
            ))
            .map(|p| p.0),
            Some("customer".to_string())
        );
        assert_eq!(
            pin(&format!(
                "SELECT * FROM customer /* a /* b */ c */ WHERE row_id = '{A}'"
            )),
            Some(("customer".to_string(), vec![A.to_string()]))
        );
    }

    #[test]
    fn numbers_end_where_duckdb_ends_them() {
        for (sql, rest) in [
            ("12 x", Some(" x")),
            ("1_000)", Some(")")),
            ("1.5,", Some(",")),
            ("2.", Some("")),
            ("2e-3 ", Some(" ")),
            ("2E+3", Some("")),
            ("1OR", None),
            ("1e", None),
            ("0x1F", None),
            ("1.2.3", None),
        ] {
            assert_eq!(after_number(sql), rest, "{sql}");
        }
        assert_eq!(
            pin(&format!(
                "SELECT * FROM customer WHERE age > 1.5e3 AND row_id = '{A}'\r\n"
            )),
            Some(("customer".to_string(), vec![A.to_string()]))
        );
    }

    #[test]
    fn one_statement_is_told_from_none_and_many() {
        use Statements::*;
        for (sql, want) in [
            ("SELECT 1", One("SELECT 1")),
            ("SELECT 1;", One("SELECT 1")),
            ("  SELECT 1 ; ;\n-- done\n", One("  SELECT 1")),
            ("SELECT 1; -- done", One("SELECT 1")),
            ("SELECT ';' /* ; */ -- ;\n", One("SELECT ';'")),
            ("SELECT 1 -- a comment", One("SELECT 1")),
            ("SELECT 1; SELECT 2", Many),
            ("COPY (SELECT 1) TO 'x'; SELECT 2;", Many),
            ("", None),
            ("-- only a comment", None),
            (" ; /* c */ ;", None),
            ("SELECT {'a': 1};", Unknown("SELECT {'a': 1}")),
        ] {
            assert_eq!(statements(sql), want, "{sql:?}");
        }
    }

    #[test]
    fn named_views_finds_identifiers_only() {
        let names = vec!["customer".to_string(), "orders".to_string()];
        assert_eq!(
            named_views("SELECT 'orders' FROM Customer__History", &names),
            Some(BTreeSet::from(["customer".to_string()]))
        );
        assert_eq!(named_views("SELECT $$x$$", &names), None);
        // A reserved word unquoted is its keyword, never a schema of that name.
        let names = vec!["customer".to_string(), "order".to_string()];
        assert_eq!(
            named_views("select * from customer order by row_id", &names),
            Some(BTreeSet::from(["customer".to_string()]))
        );
        assert_eq!(
            named_views("select * from \"order\" order by 1", &names),
            Some(BTreeSet::from(["order".to_string()]))
        );
    }

    #[test]
    fn ranges_prove_absence_only_when_stated() {
        let ids = BTreeSet::from([Uuid::parse_str(B).unwrap()]);
        assert!(may_hold(A, B, &ids));
        assert!(!may_hold(A, A, &ids));
        assert!(may_hold("", "", &ids));
    }
}
