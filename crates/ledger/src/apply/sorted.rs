//! Pages of the governance lists (tenants, API keys, budgets): the rows that pass a query's
//! filters, in the order of one sort field with the row's id as tie-breaker, after a
//! cursor position.
//!
//! These populations are an operator's inventory (thousands, not millions), so a page is a
//! scan of the resource's map: O(n) to filter, O(n + k log k) to pick the page of k, with
//! no index to keep on every write. Reservations, the population that grows with traffic,
//! have their own indexes (`crate::listing`).

use crate::{Position, SortValue};

use super::Page;

/// Where a sorted page starts and how long it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub descending: bool,
    /// The position of the previous page's last row: the page holds the rows after it.
    pub after: Option<Position>,
    pub limit: usize,
}

/// A page of rows in a total order, with the position of its last row (what a cursor for
/// the next page encodes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortedPage<T> {
    pub page: Page<T>,
    pub last: Option<Position>,
}

impl<T> SortedPage<T> {
    pub(crate) fn map<U>(self, f: impl FnMut(T) -> U) -> SortedPage<U> {
        SortedPage {
            page: Page {
                items: self.page.items.into_iter().map(f).collect(),
                has_more: self.page.has_more,
            },
            last: self.last,
        }
    }
}

/// Case-insensitive substring match of a trimmed, non-empty search term (already lower-cased)
/// against any of `fields`.
pub(crate) fn matches_search(search: Option<&str>, fields: &[&str]) -> bool {
    search.is_none_or(|term| fields.iter().any(|f| f.to_lowercase().contains(term)))
}

/// The page of `rows` in the order of `position` (ascending or descending), after
/// `window.after`.
pub(crate) fn sorted_page<T>(
    rows: impl Iterator<Item = T>,
    position: impl Fn(&T) -> Position,
    window: &Window,
) -> SortedPage<T> {
    let after = |p: &Position| match &window.after {
        None => true,
        Some(a) if window.descending => p < a,
        Some(a) => p > a,
    };
    let mut keyed: Vec<(Position, T)> = rows
        .map(|row| (position(&row), row))
        .filter(|(p, _)| after(p))
        .collect();
    let order = |a: &(Position, T), b: &(Position, T)| {
        if window.descending {
            b.0.cmp(&a.0)
        } else {
            a.0.cmp(&b.0)
        }
    };
    let take = window.limit + 1;
    if keyed.len() > take {
        keyed.select_nth_unstable_by(take - 1, order);
        keyed.truncate(take);
    }
    keyed.sort_unstable_by(order);
    let has_more = keyed.len() > window.limit;
    keyed.truncate(window.limit);
    let last = keyed.last().map(|(p, _)| p.clone());
    SortedPage {
        page: Page {
            items: keyed.into_iter().map(|(_, row)| row).collect(),
            has_more,
        },
        last,
    }
}

/// A text sort value.
pub(crate) fn text(s: &str) -> SortValue {
    SortValue::Text(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(descending: bool, after: Option<Position>, limit: usize) -> Window {
        Window {
            descending,
            after,
            limit,
        }
    }

    fn pos(v: i64, id: &str) -> Position {
        (SortValue::Int(v), id.to_string())
    }

    /// Walking every page with the previous page's last position visits each row exactly
    /// once, in order, whatever the page size and direction; ties fall back to the id.
    #[test]
    fn pages_cover_every_row_once_in_order() {
        let rows: Vec<(i64, String)> = (0..23).map(|i| (i % 5, format!("id{i:02}"))).collect();
        for descending in [false, true] {
            let mut expected: Vec<Position> = rows.iter().map(|(v, id)| pos(*v, id)).collect();
            expected.sort();
            if descending {
                expected.reverse();
            }
            for limit in [1, 2, 7, 23, 50] {
                let mut seen = Vec::new();
                let mut after = None;
                loop {
                    let page = sorted_page(
                        rows.iter(),
                        |(v, id)| pos(*v, id),
                        &window(descending, after.clone(), limit),
                    );
                    seen.extend(page.page.items.iter().map(|(v, id)| pos(*v, id)));
                    assert!(page.page.items.len() <= limit);
                    if !page.page.has_more {
                        break;
                    }
                    after = page.last;
                }
                assert_eq!(seen, expected, "descending={descending} limit={limit}");
            }
        }
    }

    #[test]
    fn search_is_a_case_insensitive_substring_of_any_field() {
        assert!(matches_search(None, &["x"]));
        assert!(matches_search(Some("acme"), &["t1", "The ACME corp"]));
        assert!(!matches_search(Some("acme"), &["t1", "other"]));
    }
}
