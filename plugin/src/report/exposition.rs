//! The Prometheus text exposition format (version 0.0.4, which OpenMetrics scrapers read
//! too): families declared with their `# HELP` and `# TYPE`, samples added to them in any
//! order, the text written family by family (the format wants a family's samples together),
//! so a part can add a pod's samples of several families pod by pod.

use std::fmt::Write as _;

/// Escapes a label value: backslash, double quote and newline are the only characters the
/// format reserves there.
pub fn escape_label(v: &str) -> String {
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

/// The families of one exposition, in the order they were declared, each with its samples.
#[derive(Default)]
pub struct Exposition {
    families: Vec<Family>,
}

struct Family {
    name: String,
    /// `# HELP` and `# TYPE`, then the samples.
    text: String,
}

impl Exposition {
    /// Declares a family (again: nothing). `help` is ours, never user data, so it needs no
    /// escaping.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        if !self.families.iter().any(|f| f.name == name) {
            self.families.push(Family {
                name: name.to_owned(),
                text: format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"),
            });
        }
        self
    }

    /// Adds a sample to family `name`, declared before. `value` is printed as is: integers
    /// stay exact (a counter past 2^53 would not).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        let family = self.families.iter_mut().rev().find(|f| f.name == name);
        let Some(Family { text, .. }) = family else {
            debug_assert!(false, "a sample of the undeclared family {name}");
            return;
        };
        text.push_str(name);
        if !labels.is_empty() {
            text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    text.push(',');
                }
                let _ = write!(text, "{k}=\"{}\"", escape_label(v));
            }
            text.push('}');
        }
        let _ = writeln!(text, " {value}");
    }

    pub fn finish(self) -> String {
        self.families.into_iter().map(|f| f.text).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_escape_backslash_quote_and_newline() {
        assert_eq!(escape_label(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label("line\nnext"), "line\\nnext");
        assert_eq!(escape_label("plain-ünïcode/1"), "plain-ünïcode/1");
        assert_eq!(escape_label(r"\n"), r"\\n");
    }

    #[test]
    fn samples_are_formatted_with_escaped_labels() {
        let mut e = Exposition::default();
        e.family("ebpf_cni_x_total", "counter", "Help text.");
        e.sample("ebpf_cni_x_total", &[("a", "q\"\\\n"), ("b", "2")], 5u32);
        e.sample("ebpf_cni_x_total", &[], 0.25);
        assert_eq!(
            e.finish(),
            "# HELP ebpf_cni_x_total Help text.\n\
             # TYPE ebpf_cni_x_total counter\n\
             ebpf_cni_x_total{a=\"q\\\"\\\\\\n\",b=\"2\"} 5\n\
             ebpf_cni_x_total 0.25\n"
        );
    }

    #[test]
    fn samples_added_out_of_order_stay_with_their_family() {
        let mut e = Exposition::default();
        e.family("a", "gauge", "A.").family("b", "gauge", "B.");
        e.sample("b", &[], 1);
        e.sample("a", &[], 2);
        e.family("a", "gauge", "A.");
        e.sample("b", &[], 3);
        assert_eq!(
            e.finish(),
            "# HELP a A.\n# TYPE a gauge\na 2\n# HELP b B.\n# TYPE b gauge\nb 1\nb 3\n"
        );
    }
}
