//! PostgreSQL ⇄ WIT `value` conversion.
//!
//! tokio-postgres prepares every statement, so the server tells us the type
//! of each parameter and each result column; the conversions below use it.
//!
//! **Parameters** ([`PgParam`]): a value whose case matches the parameter's
//! type is sent in binary (bool → `bool`; int → `int2`/`int4`/`int8`/`oid`
//! with a range check, or `float4`/`float8`; float → `float4`/`float8`;
//! blob → `bytea`). Anything else is sent in *text* format and parsed by
//! the server with the type's own input function: a `text` value binds to
//! `numeric`, `timestamptz`, `uuid`, `jsonb`, an enum, an array, ...; an
//! int binds to `numeric` or `text`. A blob binds only to `bytea`. NULL
//! binds to anything.
//!
//! **Results** ([`PgValue`]): `bool` → boolean; `int2`/`int4`/`int8`/`oid`
//! → int; `float4`/`float8` → float; `bytea` → blob; `text`, `varchar`,
//! `char(n)`, `name`, `"char"`, `citext`, `xml`, enums → text; and, as text
//! in PostgreSQL's own output format: `numeric`, `json`, `jsonb`, `uuid`,
//! `date`, `time`, `timestamp`, `timestamptz` (in UTC, `+00`). `void` (e.g.
//! `pg_sleep`) → null. Domains convert as their base type. Other types
//! (arrays, intervals, ranges, geometric, network, ...) are refused with a
//! hint to cast them in SQL (`col::text`).

use std::error::Error;
use std::fmt::Write;

use bytes::BytesMut;
use tokio_postgres::types::{Format, FromSql, IsNull, Kind, ToSql, Type, to_sql_checked};

use crate::bindings::sql::Value;

type BoxError = Box<dyn Error + Sync + Send>;

/// A parameter value, bound according to the type the server expects.
#[derive(Debug)]
pub(crate) struct PgParam<'a>(pub(crate) &'a Value);

/// The base type of a domain (recursively), or the type itself.
fn base(ty: &Type) -> &Type {
    match ty.kind() {
        Kind::Domain(inner) => base(inner),
        _ => ty,
    }
}

/// Whether `value` goes to a parameter of type `ty` in binary.
fn binary(value: &Value, ty: &Type) -> bool {
    let ty = base(ty);
    match value {
        Value::Null | Value::Blob(_) => true,
        Value::Boolean(_) => *ty == Type::BOOL,
        Value::Int(_) => [
            Type::INT2,
            Type::INT4,
            Type::INT8,
            Type::OID,
            Type::FLOAT4,
            Type::FLOAT8,
        ]
        .contains(ty),
        Value::Float(_) => [Type::FLOAT4, Type::FLOAT8].contains(ty),
        Value::Text(_) => false,
    }
}

impl ToSql for PgParam<'_> {
    /// Must agree with [`binary`], which picks the format.
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        let base = base(ty);
        match self.0 {
            Value::Null => Ok(IsNull::Yes),
            Value::Boolean(b) if *base == Type::BOOL => b.to_sql(base, out),
            Value::Boolean(b) => as_text(out, if *b { "true" } else { "false" }),
            Value::Int(i) => match *base {
                Type::INT8 => i.to_sql(base, out),
                Type::INT4 => i32::try_from(*i).map_err(|_| range(*i, base))?.to_sql(base, out),
                Type::INT2 => i16::try_from(*i).map_err(|_| range(*i, base))?.to_sql(base, out),
                Type::OID => u32::try_from(*i).map_err(|_| range(*i, base))?.to_sql(base, out),
                Type::FLOAT4 => (*i as f32).to_sql(base, out),
                Type::FLOAT8 => (*i as f64).to_sql(base, out),
                _ => as_text(out, &i.to_string()),
            },
            Value::Float(f) => match *base {
                Type::FLOAT4 => (*f as f32).to_sql(base, out),
                Type::FLOAT8 => f.to_sql(base, out),
                _ => as_text(out, &float_text(*f)),
            },
            Value::Text(text) => as_text(out, text),
            Value::Blob(bytes) if *base == Type::BYTEA => bytes.as_slice().to_sql(base, out),
            Value::Blob(_) => Err(format!("a blob binds only to a bytea parameter, not to {}", ty.name()).into()),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    fn encode_format(&self, ty: &Type) -> Format {
        if binary(self.0, ty) {
            Format::Binary
        } else {
            Format::Text
        }
    }

    to_sql_checked!();
}

/// Writes `text` as a text-format parameter.
fn as_text(out: &mut BytesMut, text: &str) -> Result<IsNull, BoxError> {
    out.extend_from_slice(text.as_bytes());
    Ok(IsNull::No)
}

fn range(value: i64, ty: &Type) -> BoxError {
    format!("{value} is out of range for a parameter of type {}", ty.name()).into()
}

/// A float in PostgreSQL's text input syntax.
fn float_text(f: f64) -> String {
    if f.is_nan() {
        "NaN".to_owned()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned()
    } else {
        f.to_string()
    }
}

/// A result value, read according to its column's type.
pub(crate) struct PgValue(pub(crate) Value);

impl<'a> FromSql<'a> for PgValue {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        decode(ty, raw).map(PgValue)
    }

    fn from_sql_null(_: &Type) -> Result<Self, BoxError> {
        Ok(PgValue(Value::Null))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

fn decode(ty: &Type, raw: &[u8]) -> Result<Value, BoxError> {
    match ty.kind() {
        Kind::Domain(inner) => return decode(inner, raw),
        Kind::Enum(_) => return text(raw),
        _ => {}
    }
    Ok(match *ty {
        Type::BOOL => Value::Boolean(bool::from_sql(ty, raw)?),
        Type::INT2 => Value::Int(i16::from_sql(ty, raw)?.into()),
        Type::INT4 => Value::Int(i32::from_sql(ty, raw)?.into()),
        Type::INT8 => Value::Int(i64::from_sql(ty, raw)?),
        Type::OID => Value::Int(u32::from_sql(ty, raw)?.into()),
        Type::FLOAT4 => Value::Float(f32::from_sql(ty, raw)?.into()),
        Type::FLOAT8 => Value::Float(f64::from_sql(ty, raw)?),
        Type::BYTEA => Value::Blob(raw.to_vec()),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN | Type::XML | Type::JSON => text(raw)?,
        Type::CHAR => Value::Text(char::from(raw.first().copied().unwrap_or(0)).to_string()),
        Type::JSONB => match raw.split_first() {
            Some((1, json)) => text(json)?,
            _ => return Err("unknown jsonb format version".into()),
        },
        Type::NUMERIC => Value::Text(numeric(raw)?),
        Type::UUID => Value::Text(uuid(raw)?),
        Type::DATE => Value::Text(date(i32::from_be_bytes(fixed(raw)?))),
        Type::TIME => Value::Text(time_of_day(i64::from_be_bytes(fixed(raw)?))),
        Type::TIMESTAMP => Value::Text(timestamp(i64::from_be_bytes(fixed(raw)?), "")),
        Type::TIMESTAMPTZ => Value::Text(timestamp(i64::from_be_bytes(fixed(raw)?), "+00")),
        Type::VOID => Value::Null,
        _ if ty.name() == "citext" => text(raw)?,
        _ => {
            return Err(format!(
                "columns of type {} are not supported: cast it in SQL, e.g. `SELECT col::text`",
                ty.name()
            )
            .into());
        }
    })
}

fn text(raw: &[u8]) -> Result<Value, BoxError> {
    Ok(Value::Text(String::from_utf8(raw.to_vec())?))
}

fn fixed<const N: usize>(raw: &[u8]) -> Result<[u8; N], BoxError> {
    raw.try_into()
        .map_err(|_| format!("expected {N} bytes, got {}", raw.len()).into())
}

/// `numeric`'s binary form (base-10000 digits) as PostgreSQL prints it.
fn numeric(raw: &[u8]) -> Result<String, BoxError> {
    let word = |i: usize| -> Result<u16, BoxError> {
        raw.get(i * 2..i * 2 + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(|| "truncated numeric".into())
    };
    let ndigits = usize::from(word(0)?);
    let weight = i64::from(word(1)? as i16);
    let sign = word(2)?;
    let dscale = usize::from(word(3)?);
    match sign {
        0x0000 | 0x4000 => {}
        0xC000 => return Ok("NaN".to_owned()),
        0xD000 => return Ok("Infinity".to_owned()),
        0xF000 => return Ok("-Infinity".to_owned()),
        other => return Err(format!("unknown numeric sign {other:#x}").into()),
    }
    let digits: Vec<u16> = (0..ndigits).map(|i| word(4 + i)).collect::<Result<_, _>>()?;
    // Group k holds the digits of 10000^(weight - k).
    let group = |k: i64| {
        usize::try_from(k)
            .ok()
            .and_then(|k| digits.get(k))
            .copied()
            .unwrap_or(0)
    };
    let mut out = String::new();
    if sign == 0x4000 {
        out.push('-');
    }
    if weight < 0 {
        out.push('0');
    } else {
        for k in 0..=weight {
            // Writing to a String cannot fail.
            let _ = if k == 0 {
                write!(out, "{}", group(k))
            } else {
                write!(out, "{:04}", group(k))
            };
        }
    }
    if dscale > 0 {
        let mut fraction = String::new();
        let mut k = weight + 1;
        while fraction.len() < dscale {
            let _ = write!(fraction, "{:04}", group(k));
            k += 1;
        }
        fraction.truncate(dscale);
        out.push('.');
        out.push_str(&fraction);
    }
    Ok(out)
}

fn uuid(raw: &[u8]) -> Result<String, BoxError> {
    let bytes: [u8; 16] = fixed(raw)?;
    let hex = hex::encode(bytes);
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    ))
}

/// Days since 2000-01-01 (PostgreSQL's epoch) as `YYYY-MM-DD[ BC]`.
fn date(days: i32) -> String {
    match days {
        i32::MAX => "infinity".to_owned(),
        i32::MIN => "-infinity".to_owned(),
        days => civil(i64::from(days)),
    }
}

fn civil(days_since_2000: i64) -> String {
    let (year, month, day) = crate::time::civil_from_days(days_since_2000 + 10_957);
    if year <= 0 {
        format!("{:04}-{month:02}-{day:02} BC", 1 - year)
    } else {
        format!("{year:04}-{month:02}-{day:02}")
    }
}

/// Microseconds since midnight as `HH:MM:SS[.ffffff]`.
fn time_of_day(micros: i64) -> String {
    let seconds = micros.div_euclid(1_000_000);
    let fraction = micros.rem_euclid(1_000_000);
    let mut out = format!("{:02}:{:02}:{:02}", seconds / 3600, seconds / 60 % 60, seconds % 60);
    if fraction != 0 {
        let digits = format!("{fraction:06}");
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
    out
}

/// Microseconds since 2000-01-01 00:00 as `YYYY-MM-DD HH:MM:SS[.ffffff]`
/// plus `zone`, with the BC marker last as PostgreSQL puts it.
fn timestamp(micros: i64, zone: &str) -> String {
    match micros {
        i64::MAX => return "infinity".to_owned(),
        i64::MIN => return "-infinity".to_owned(),
        _ => {}
    }
    const DAY: i64 = 86_400_000_000;
    let date = civil(micros.div_euclid(DAY));
    let time = time_of_day(micros.rem_euclid(DAY));
    match date.strip_suffix(" BC") {
        Some(date) => format!("{date} {time}{zone} BC"),
        None => format!("{date} {time}{zone}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numeric_bytes(ndigits: u16, weight: i16, sign: u16, dscale: u16, digits: &[u16]) -> Vec<u8> {
        let mut raw = Vec::new();
        for word in [ndigits, weight as u16, sign, dscale]
            .into_iter()
            .chain(digits.iter().copied())
        {
            raw.extend_from_slice(&word.to_be_bytes());
        }
        raw
    }

    #[test]
    fn numerics_print_like_postgres() {
        assert_eq!(numeric(&numeric_bytes(2, 1, 0, 2, &[12, 3456])).unwrap(), "123456.00");
        assert_eq!(numeric(&numeric_bytes(2, 0, 0x4000, 3, &[1, 2500])).unwrap(), "-1.250");
        assert_eq!(numeric(&numeric_bytes(1, -2, 0, 6, &[1200])).unwrap(), "0.000012");
        assert_eq!(numeric(&numeric_bytes(0, 0, 0, 0, &[])).unwrap(), "0");
        assert_eq!(numeric(&numeric_bytes(1, 2, 0, 0, &[5])).unwrap(), "500000000");
        assert_eq!(numeric(&numeric_bytes(0, 0, 0xC000, 0, &[])).unwrap(), "NaN");
        assert!(numeric(&[0, 1]).is_err());
    }

    #[test]
    fn dates_and_times_print_like_postgres() {
        assert_eq!(date(0), "2000-01-01");
        assert_eq!(date(-1), "1999-12-31");
        assert_eq!(date(8_825), "2024-02-29");
        assert_eq!(date(-730_119), "0001-01-01");
        assert_eq!(date(-730_120), "0001-12-31 BC");
        assert_eq!(time_of_day(3_723_000_000), "01:02:03");
        assert_eq!(time_of_day(1_500), "00:00:00.0015");
        assert_eq!(
            timestamp(8_825 * 86_400_000_000 + 45_296_789_000, "+00"),
            "2024-02-29 12:34:56.789+00"
        );
        assert_eq!(timestamp(i64::MAX, ""), "infinity");
    }

    #[test]
    fn uuids_print_hyphenated() {
        let raw: Vec<u8> = (0u8..16).collect();
        assert_eq!(uuid(&raw).unwrap(), "00010203-0405-0607-0809-0a0b0c0d0e0f");
    }
}
