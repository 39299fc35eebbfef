//! Aligned text tables, as istioctl prints them (Go's tabwriter: each column as wide as its widest
//! cell plus the padding; the last column unpadded).

/// `header` and `rows` as lines of aligned columns, `padding` spaces between columns.
pub fn render(header: &[&str], rows: &[Vec<String>], padding: usize) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let last = row.len().saturating_sub(1);
        for (i, cell) in row.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                let width = widths.get(i).copied().unwrap_or_default();
                out.push_str(&" ".repeat(width - cell.chars().count() + padding));
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let rows =
            vec![vec!["a".to_string(), "bb".to_string(), "c".to_string()], vec!["dddd".into(), "e".into(), "f".into()]];
        assert_eq!(render(&["X", "Y", "Z"], &rows, 2), "X     Y   Z\na     bb  c\ndddd  e   f\n");
    }
}
