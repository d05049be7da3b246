//! Paging through long lists: `?page=N` (from 1), a fixed number of
//! entries to a page, and the links to the pages before and after. The
//! page is read from the query as the visitor sent it: anything that is not
//! a number from 1 up is page 1, and a page past the end shows nothing but
//! the way back.

use serde::Serialize;

/// Most pages one can ask for: bounds the offsets sent to Redis.
const MAX_PAGE: usize = 1_000_000;

/// The page asked for in `query` (1 if none or not a page number).
pub(super) fn asked(query: Option<&str>) -> usize {
    query
        .and_then(|q| super::form::query_param(q, "page"))
        .and_then(|p| p.trim().parse::<usize>().ok())
        .filter(|p| (1..=MAX_PAGE).contains(p))
        .unwrap_or(1)
}

/// Where page `page` of `per_page` entries starts.
pub(super) fn start(page: usize, per_page: usize) -> usize {
    (page - 1).saturating_mul(per_page)
}

/// What a listing says about its place in the list.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(super) struct Pager {
    /// This page (from 1).
    pub(super) page: usize,
    /// Pages in all (at least 1).
    pub(super) pages: usize,
    /// The link to the page before, if there is one.
    pub(super) prev: Option<String>,
    /// The link to the page after, if there is one.
    pub(super) next: Option<String>,
}

/// The pager of page `page` of a list of `total` entries, `per_page` to a
/// page; `link(n)` is the address of page `n`.
pub(super) fn pager(page: usize, total: u64, per_page: usize, link: impl Fn(usize) -> String) -> Pager {
    let total = usize::try_from(total).unwrap_or(usize::MAX);
    let pages = total.div_ceil(per_page.max(1)).max(1);
    Pager {
        page,
        pages,
        prev: (page > 1).then(|| link((page - 1).min(pages))),
        next: (page < pages).then(|| link(page + 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_read_leniently() {
        assert_eq!(asked(None), 1);
        assert_eq!(asked(Some("page=3")), 3);
        assert_eq!(asked(Some("class=X&page=2")), 2);
        for bad in [
            "page=0",
            "page=-1",
            "page=abc",
            "page=99999999999999999999999",
            "page=1000001",
        ] {
            assert_eq!(asked(Some(bad)), 1, "{bad}");
        }
        assert_eq!(start(1, 100), 0);
        assert_eq!(start(3, 100), 200);
    }

    #[test]
    fn links_go_where_there_is_something() {
        let link = |n: usize| format!("?page={n}");
        assert_eq!(
            pager(1, 0, 100, link),
            Pager {
                page: 1,
                pages: 1,
                prev: None,
                next: None
            }
        );
        let middle = pager(2, 250, 100, link);
        assert_eq!(
            (middle.pages, middle.prev.as_deref(), middle.next.as_deref()),
            (3, Some("?page=1"), Some("?page=3"))
        );
        let last = pager(3, 300, 100, link);
        assert_eq!((last.pages, last.next), (3, None));
        // Past the end: back to the last page.
        let past = pager(9, 150, 100, link);
        assert_eq!((past.prev.as_deref(), past.next), (Some("?page=2"), None));
    }
}
