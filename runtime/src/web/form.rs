//! Reading urlencoded queries and form bodies, for every page.

/// The decoded value of `name` in a urlencoded `query` or form.
pub(super) fn query_param(query: &str, name: &str) -> Option<String> {
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}
