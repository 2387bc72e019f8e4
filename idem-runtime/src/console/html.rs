//! The console's HTML: every value escaped, one layout, tables and one-button forms.

use std::fmt::Write;

/// `text` safe inside an element or a quoted attribute.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// What a page is rendered for: where the console is mounted, who looks, whether they may act.
pub(crate) struct Frame<'a> {
    /// The path the console is nested at (`/ops/idem`; empty at the root).
    pub(crate) base: &'a str,
    pub(crate) actor: &'a str,
    /// The form token of `actor`; `None` in read-only mode (no buttons).
    pub(crate) token: Option<&'a str>,
    /// A note on what the last action did.
    pub(crate) note: Option<&'a str>,
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}\
nav{background:#1d2330;padding:10px 24px}nav a{color:#e8ebf2;margin-right:20px;text-decoration:none}\
nav a.here{font-weight:600;border-bottom:2px solid #7fb0ff}nav span{float:right;color:#9aa3b5}\
main{padding:12px 24px 40px;max-width:1200px}h1{font-size:20px}h2{font-size:16px;margin-top:28px}\
table{border-collapse:collapse;background:#fff;margin:6px 0}th,td{padding:5px 10px;border-bottom:1px solid #e3e6ec;text-align:left;vertical-align:top}\
th{background:#eef0f4;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}\
.note{background:#e6f4ea;border:1px solid #9bd3ae;padding:8px 12px}.ro{background:#fff4e5;border:1px solid #f0c36d;padding:8px 12px}\
.bad{color:#b3261e}.ok{color:#1e7e34}form{display:inline;margin:0}\
button{font:inherit;padding:2px 10px;border:1px solid #8a94a6;border-radius:4px;background:#fff;cursor:pointer}\
button.danger{border-color:#b3261e;color:#b3261e}.tiles{display:flex;gap:12px;flex-wrap:wrap}\
.tile{background:#fff;border:1px solid #e3e6ec;padding:10px 16px;min-width:120px}.tile b{display:block;font-size:22px}\
.chart{display:block}.legend svg{vertical-align:-1px;margin-left:8px}";

/// A whole page: the navigation, `title`, then `body`.
pub(crate) fn page(frame: &Frame<'_>, here: &str, title: &str, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + 4096);
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\"><title>{} · idem</title>\
         <style>{STYLE}</style></head><body><nav>",
        escape(title)
    );
    for (path, label) in [
        ("/", "Overview"),
        ("/outbox", "Outbox"),
        ("/inbox", "Inbox"),
        ("/tables", "Tables"),
    ] {
        let class = if path == here { " class=\"here\"" } else { "" };
        let _ = write!(
            out,
            "<a href=\"{}\"{class}>{label}</a>",
            link(frame.base, path)
        );
    }
    let _ = write!(
        out,
        "<span>{}</span></nav><main><h1>{}</h1>",
        escape(frame.actor),
        escape(title)
    );
    if frame.token.is_none() {
        out.push_str(
            "<p class=\"ro\">Read-only: this console shows idem's state and changes nothing.</p>",
        );
    }
    if let Some(note) = frame.note {
        let _ = write!(out, "<p class=\"note\" id=\"note\">{}</p>", escape(note));
    }
    out.push_str(body);
    out.push_str("</main></body></html>");
    out
}

/// The console's `path` under `base`.
pub(crate) fn link(base: &str, path: &str) -> String {
    let joined = if path == "/" {
        if base.is_empty() {
            "/".to_owned()
        } else {
            base.to_owned()
        }
    } else {
        format!("{base}{path}")
    };
    escape(&joined)
}

/// A table of `header` and `rows` (cells already HTML); `numeric` columns right-aligned.
pub(crate) fn table(id: &str, header: &[&str], numeric: &[usize], rows: &[Vec<String>]) -> String {
    let mut out = format!("<table id=\"{id}\"><tr>");
    for h in header {
        let _ = write!(out, "<th>{h}</th>");
    }
    out.push_str("</tr>");
    for row in rows {
        out.push_str("<tr>");
        for (i, cell) in row.iter().enumerate() {
            let class = if numeric.contains(&i) {
                " class=\"n\""
            } else {
                ""
            };
            let _ = write!(out, "<td{class}>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

/// A form of one button posting `fields` (and the token) to `action`; nothing without a
/// token (read-only).
pub(crate) fn button(
    frame: &Frame<'_>,
    action: &str,
    fields: &[(&str, &str)],
    label: &str,
    danger: bool,
) -> String {
    let Some(token) = frame.token else {
        return String::new();
    };
    let mut out = format!(
        "<form method=\"post\" action=\"{}\">",
        link(frame.base, action)
    );
    for (name, value) in fields.iter().chain([("csrf", token)].iter()) {
        let _ = write!(
            out,
            "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
            escape(name),
            escape(value)
        );
    }
    let class = if danger { " class=\"danger\"" } else { "" };
    let _ = write!(out, "<button{class}>{}</button></form>", escape(label));
    out
}

/// This instance's clock, in milliseconds since the Unix epoch.
pub(crate) fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// How long ago `millis` (since the Unix epoch) was, by this instance's clock: `42s ago`,
/// `5m ago`, `3h ago`, `2d ago`.
pub(crate) fn ago(millis: i64) -> String {
    let elapsed = now_millis() - millis;
    if elapsed < 0 {
        return format!("in {}", span(-elapsed));
    }
    format!("{} ago", span(elapsed))
}

/// A length of time in its largest fitting unit: `42s`, `5m`, `3h`, `2d`.
pub(crate) fn span(millis: i64) -> String {
    let (n, unit) = match millis / 1000 {
        s if s < 120 => (s, "s"),
        s if s < 7200 => (s / 60, "m"),
        s if s < 172_800 => (s / 3600, "h"),
        s => (s / 86_400, "d"),
    };
    format!("{n}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_of_time_take_their_largest_unit() {
        assert_eq!(span(0), "0s");
        assert_eq!(span(119_999), "119s");
        assert_eq!(span(3_599_000), "59m");
        assert_eq!(span(7_200_000), "2h");
        assert_eq!(span(3 * 86_400_000), "3d");
    }

    #[test]
    fn every_value_is_escaped() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"y\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;"
        );
    }

    #[test]
    fn links_follow_where_the_console_is_mounted() {
        assert_eq!(link("", "/"), "/");
        assert_eq!(link("", "/outbox"), "/outbox");
        assert_eq!(link("/ops/idem", "/"), "/ops/idem");
        assert_eq!(link("/ops/idem", "/inbox"), "/ops/idem/inbox");
    }

    #[test]
    fn a_read_only_frame_renders_no_button() {
        let frame = Frame {
            base: "",
            actor: "a",
            token: None,
            note: None,
        };
        assert_eq!(
            button(&frame, "/outbox", &[("id", "1")], "Requeue", false),
            ""
        );
        let frame = Frame {
            token: Some("t"),
            ..frame
        };
        let form = button(&frame, "/outbox", &[("id", "<1>")], "Requeue", false);
        assert!(form.contains("name=\"id\" value=\"&lt;1&gt;\""), "{form}");
        assert!(form.contains("name=\"csrf\" value=\"t\""), "{form}");
    }
}
