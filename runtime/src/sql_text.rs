//! Reading the head of an SQL statement: what the SQL capability's guard
//! (`host::sql`) and the spans (`otel::host`) both need, as a leaf.

/// The statement's first keyword, upper-cased (`SELECT`, `INSERT`, …),
/// after blanks and comments; empty if there is none.
pub(crate) fn first_keyword(statement: &str) -> String {
    skip_blanks_and_comments(statement)
        .chars()
        .take_while(char::is_ascii_alphabetic)
        .take(32)
        .collect::<String>()
        .to_ascii_uppercase()
}

/// `text` after leading whitespace, empty statements (`;`), `-- line` and
/// `/* block */` comments.
pub(crate) fn skip_blanks_and_comments(mut text: &str) -> &str {
    loop {
        text = text.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
        if let Some(rest) = text.strip_prefix("--") {
            text = rest.split_once('\n').map_or("", |(_, after)| after);
        } else if let Some(rest) = text.strip_prefix("/*") {
            // PostgreSQL nests block comments; count them.
            let mut depth = 1;
            let mut chars = rest.char_indices().peekable();
            let mut end = rest.len();
            while let Some((i, c)) = chars.next() {
                match (c, chars.peek().map(|&(_, n)| n)) {
                    ('/', Some('*')) => {
                        depth += 1;
                        chars.next();
                    }
                    ('*', Some('/')) => {
                        depth -= 1;
                        chars.next();
                        if depth == 0 {
                            end = i + 2;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            text = &rest[end..];
        } else {
            return text;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_operations_are_the_first_keyword() {
        assert_eq!(first_keyword("  -- hi\n/* c */ select 1"), "SELECT");
        assert_eq!(first_keyword("WITH x AS (SELECT 1) SELECT * FROM x"), "WITH");
        assert_eq!(first_keyword("(SELECT 1)"), "");
        assert_eq!(first_keyword(""), "");
    }
}
