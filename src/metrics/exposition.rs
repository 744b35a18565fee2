//! The Prometheus text exposition format (version 0.0.4), written by hand: a handful of gauge
//! families, each with its `# HELP` and `# TYPE` lines and its samples, label values escaped
//! (docs/operations.md, "Metrics").

use std::fmt::Write as _;

/// One labelled value.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    labels: Vec<(&'static str, String)>,
    value: f64,
}

/// A metric family: its name, help text and samples.
#[derive(Debug, Clone, PartialEq)]
struct Family {
    name: &'static str,
    help: &'static str,
    samples: Vec<Sample>,
}

/// A set of gauge families, rendered in the order they were first used.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    /// Adds a sample of gauge `name` (the family is created on first use with `help`).
    pub fn gauge(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
        value: f64,
    ) {
        let sample = Sample {
            labels: labels.iter().map(|(k, v)| (*k, (*v).to_string())).collect(),
            value,
        };
        match self.families.iter_mut().find(|f| f.name == name) {
            Some(f) => f.samples.push(sample),
            None => self.families.push(Family {
                name,
                help,
                samples: vec![sample],
            }),
        }
    }

    /// Whether a family named `name` has a sample.
    pub fn has(&self, name: &str) -> bool {
        self.families.iter().any(|f| f.name == name)
    }

    /// The text format: every family's `# HELP`, `# TYPE … gauge` and sample lines.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.families {
            let _ = writeln!(out, "# HELP {} {}", f.name, escape_help(f.help));
            let _ = writeln!(out, "# TYPE {} gauge", f.name);
            for s in &f.samples {
                out.push_str(f.name);
                if !s.labels.is_empty() {
                    out.push('{');
                    for (i, (k, v)) in s.labels.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        let _ = write!(out, "{k}=\"{}\"", escape_label(v));
                    }
                    out.push('}');
                }
                let _ = writeln!(out, " {}", number(s.value));
            }
        }
        out
    }
}

/// A sample value as the format spells it (`NaN`, `+Inf`, `-Inf`, else the shortest decimal
/// that reads back as the same number).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_string()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else {
        format!("{v}")
    }
}

/// A label value: backslash, double quote and line feed escaped. Other bytes (schema names
/// come from the database) pass through; the format is UTF-8.
fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Help text: backslash and line feed escaped.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// The value of the first sample of `name` whose labels include `labels`, read from a text
/// exposition (lakecdc's own previous file: one sample per line, no timestamps).
pub fn read_sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (label_part, value) = match rest.strip_prefix('{') {
                Some(r) => {
                    let end = r.rfind('}')?;
                    (&r[..end], r[end + 1..].trim())
                }
                None if rest.starts_with(' ') => ("", rest.trim()),
                None => return None,
            };
            let all = labels
                .iter()
                .all(|(k, v)| label_part.contains(&format!("{k}=\"{}\"", escape_label(v))));
            all.then(|| value.parse::<f64>().ok()).flatten()
        })
        .next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_with_help_type_and_escaped_labels() {
        let mut e = Exposition::default();
        e.gauge("lakecdc_a", "An a.", &[("schema", "x\"y\\z\nw")], 1.0);
        e.gauge("lakecdc_b", "A b.", &[], 1_733_000_000.25);
        e.gauge("lakecdc_a", "An a.", &[("schema", "plain")], f64::NAN);
        assert_eq!(
            e.render(),
            "# HELP lakecdc_a An a.\n# TYPE lakecdc_a gauge\n\
             lakecdc_a{schema=\"x\\\"y\\\\z\\nw\"} 1\nlakecdc_a{schema=\"plain\"} NaN\n\
             # HELP lakecdc_b A b.\n# TYPE lakecdc_b gauge\nlakecdc_b 1733000000.25\n"
        );
        assert!(e.has("lakecdc_b") && !e.has("lakecdc_c"));
    }

    #[test]
    fn a_sample_is_read_back_by_name_and_labels() {
        let mut e = Exposition::default();
        e.gauge("lakecdc_t", "T.", &[("command", "flush")], 17.5);
        e.gauge("lakecdc_t", "T.", &[("command", "gc")], 3.0);
        e.gauge("lakecdc_t_other", "T.", &[("command", "flush")], 9.0);
        let text = e.render();
        assert_eq!(
            read_sample(&text, "lakecdc_t", &[("command", "flush")]),
            Some(17.5)
        );
        assert_eq!(
            read_sample(&text, "lakecdc_t", &[("command", "gc")]),
            Some(3.0)
        );
        assert_eq!(
            read_sample(&text, "lakecdc_t", &[("command", "init")]),
            None
        );
        assert_eq!(read_sample("garbage{", "lakecdc_t", &[]), None);
    }
}
