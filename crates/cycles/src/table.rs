//! How `cycles admin` shows a list: a table on a terminal, JSON otherwise (or with `--json`),
//! so that a pipe or a script always gets the server's full rows.

use std::io::IsTerminal;

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::Table;
use serde_json::Value;

use crate::output::say;

/// A column: its header, and the JSON pointer of its value in a row (`/allocated/amount`).
pub type Column = (&'static str, &'static str);

/// Prints `rows` with `columns` as a table when stdout is a terminal and `json` is off,
/// else as a JSON array of the whole rows.
pub fn print(rows: &[Value], columns: &[Column], json: bool) -> anyhow::Result<()> {
    if json || !std::io::stdout().is_terminal() {
        say!("{}", serde_json::to_string_pretty(rows)?)?;
        return Ok(());
    }
    say!("{}", render(rows, columns))?;
    say!(
        "{} row{}",
        rows.len(),
        if rows.len() == 1 { "" } else { "s" }
    )?;
    Ok(())
}

fn render(rows: &[Value], columns: &[Column]) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(columns.iter().map(|(header, _)| *header));
    for row in rows {
        table.add_row(
            columns
                .iter()
                .map(|(_, pointer)| cell(row.pointer(pointer))),
        );
    }
    table
}

/// A value as a cell: strings bare, lists joined, absent as empty.
fn cell(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| cell(Some(v)))
            .collect::<Vec<_>>()
            .join(", "),
        Some(other) => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cells_show_nested_values_and_lists() {
        let rows = [json!({"id": "k1", "allocated": {"amount": 5}, "permissions": ["a", "b"]})];
        let text = render(
            &rows,
            &[
                ("ID", "/id"),
                ("ALLOCATED", "/allocated/amount"),
                ("P", "/permissions"),
                ("X", "/missing"),
            ],
        )
        .to_string();
        assert!(
            text.contains("k1") && text.contains('5') && text.contains("a, b"),
            "{text}"
        );
        assert!(text.contains("ALLOCATED"), "{text}");
    }
}
