//! How results are printed: a view type (serde) as JSON, or text with aligned tables.
//! Ids in messages are always written one way, in double quotes (`q`), as the servers'
//! messages do; table cells carry them bare.

use comfy_table::{Table, presets};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// One segment of a segmented pool, as `agent stock` (the agent's view) and `channel
/// show` (the center's, as last reported) print it.
#[derive(Serialize)]
pub struct SegmentView {
    pub segment: u32,
    pub available: u64,
    pub reserved: u64,
    pub sold: u64,
    /// The store lost the segment: its units are in doubt at the center.
    pub lost: bool,
}

impl SegmentView {
    /// The first cell of its text row, printed under its item's sums.
    pub fn label(&self) -> String {
        format!("  segment {}{}", self.segment, if self.lost { " (lost)" } else { "" })
    }

    /// Its counters as text cells.
    pub fn counts(&self) -> [String; 3] {
        [self.available, self.reserved, self.sold].map(|n| n.to_string())
    }
}

impl From<&inventory_proto::v1::SegmentStock> for SegmentView {
    fn from(g: &inventory_proto::v1::SegmentStock) -> Self {
        Self { segment: g.segment, available: g.available, reserved: g.reserved, sold: g.sold, lost: g.lost }
    }
}

impl From<&inventory_proto::v1::SegmentCounts> for SegmentView {
    fn from(g: &inventory_proto::v1::SegmentCounts) -> Self {
        Self { segment: g.segment, available: g.available, reserved: g.reserved, sold: g.sold, lost: g.lost }
    }
}

pub fn print<T: Serialize>(output: Output, view: &T, text: impl FnOnce() -> String) {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(view).expect("views serialize")),
        Output::Table => print!("{}", text()),
    }
}

/// An id (item, channel, user, key, reservation) inside a message.
pub fn q(id: &str) -> String {
    format!("{id:?}")
}

/// Columns aligned on two spaces, no borders; every line ends with a newline.
pub fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut t = Table::new();
    t.load_style(presets::NOTHING).set_header(header.to_vec()).add_rows(rows);
    let last = t.column_count().saturating_sub(1);
    for (i, column) in t.column_iter_mut().enumerate() {
        column.set_padding((0, if i == last { 0 } else { 2 }));
    }
    let mut text = t.trim_fmt();
    text.push('\n');
    text
}

/// Key/value pairs, one per line, keys aligned.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    pairs.iter().map(|(k, v)| format!("{k:<width$}  {v}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_aligned() {
        let rows = vec![vec!["a-long-item".into(), "5".into()], vec!["b".into(), "100".into()]];
        assert_eq!(table(&["ITEM", "TOTAL"], rows), "ITEM         TOTAL\na-long-item  5\nb            100\n");
    }

    #[test]
    fn fields_align_keys() {
        assert_eq!(fields(&[("a", "1".into()), ("long", "2".into())]), "a     1\nlong  2\n");
    }

    #[test]
    fn ids_are_quoted_one_way() {
        assert_eq!(q("launch-bundle"), "\"launch-bundle\"");
        assert_eq!(q("bad\"id"), "\"bad\\\"id\"");
    }
}
