//! Aligned plain-text tables for terminal output.

pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Self { header: header.iter().map(|h| h.to_string()).collect(), rows: Vec::new() }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.len()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                if i < widths.len() {
                    widths[i] = widths[i].max(cell.chars().count());
                }
            }
        }
        let line = |cells: &[String]| {
            let padded: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(i, c)| format!("{c:<w$}", w = widths.get(i).copied().unwrap_or(0)))
                .collect();
            padded.join("  ").trim_end().to_owned()
        };
        let mut out = line(&self.header);
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
            out.push('\n');
        }
        out
    }
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
        let mut t = Table::new(&["item", "total"]);
        t.row(vec!["a-long-item".into(), "5".into()]);
        t.row(vec!["b".into(), "100".into()]);
        assert_eq!(t.render(), "item         total\na-long-item  5\nb            100\n");
    }

    #[test]
    fn fields_align_keys() {
        assert_eq!(fields(&[("a", "1".into()), ("long", "2".into())]), "a     1\nlong  2\n");
    }
}
