//! Label selectors read with Kubernetes' grammar (`k8s.io/apimachinery`'s
//! `labels.Parse`): requirements separated by commas, each `key`, `!key`,
//! `key=value` (or `==`), `key!=value`, `key in (v1,v2)` or
//! `key notin (v1,v2)`; keys and values checked as the API server checks
//! them, with an error that says what is wrong.

use std::collections::BTreeSet;

use kube::core::Expression;

/// The requirements of `text`, in the order written.
pub(crate) fn parse(text: &str) -> Result<Vec<Expression>, String> {
    split_requirements(text)?.into_iter().map(requirement).collect()
}

/// The label key `e` is about.
pub(crate) fn key_of(e: &Expression) -> &str {
    match e {
        Expression::In(k, _)
        | Expression::NotIn(k, _)
        | Expression::Equal(k, _)
        | Expression::NotEqual(k, _)
        | Expression::Exists(k)
        | Expression::DoesNotExist(k) => k,
    }
}

/// The requirements of a selector: split at the commas outside parentheses.
fn split_requirements(text: &str) -> Result<Vec<&str>, String> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(format!("unbalanced parentheses in the selector {text:?}"));
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced parentheses in the selector {text:?}"));
    }
    parts.push(&text[start..]);
    let parts: Vec<&str> = parts.into_iter().map(str::trim).collect();
    if parts.len() > 1 && parts.iter().any(|p| p.is_empty()) {
        return Err(format!("an empty requirement in the selector {text:?} (a comma too many?)"));
    }
    Ok(parts.into_iter().filter(|p| !p.is_empty()).collect())
}

/// One requirement: `key`, `!key`, `key=v`, `key==v`, `key!=v`,
/// `key in (..)`, `key notin (..)`.
fn requirement(text: &str) -> Result<Expression, String> {
    if text.contains(['<', '>']) {
        return Err(format!("{text:?}: the operators < and > are not supported in a shard selector"));
    }
    if let Some(key) = text.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(label_key(key.trim())?));
    }
    if let Some((key, value)) = text.split_once("!=") {
        return Ok(Expression::NotEqual(label_key(key.trim())?, label_value(value.trim())?));
    }
    if let Some((key, value)) = text.split_once('=') {
        let value = value.strip_prefix('=').unwrap_or(value);
        return Ok(Expression::Equal(label_key(key.trim())?, label_value(value.trim())?));
    }
    if let Some(open) = text.find('(') {
        let (head, set) = (text[..open].trim(), text[open..].trim());
        let values = set
            .strip_prefix('(')
            .and_then(|s| s.strip_suffix(')'))
            .ok_or_else(|| format!("{text:?}: expected a set like (a,b)"))?;
        let values = values.split(',').map(|v| label_value(v.trim())).collect::<Result<BTreeSet<_>, _>>()?;
        return match head.rsplit_once(char::is_whitespace) {
            Some((key, "in")) => Ok(Expression::In(label_key(key.trim())?, values)),
            Some((key, "notin")) => Ok(Expression::NotIn(label_key(key.trim())?, values)),
            _ => Err(format!("{text:?}: expected `key in (...)` or `key notin (...)`")),
        };
    }
    Ok(Expression::Exists(label_key(text)?))
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at
/// most 63 characters.
fn label_key(key: &str) -> Result<String, String> {
    let (prefix, name) = key.rsplit_once('/').map_or((None, key), |(p, n)| (Some(p), n));
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    });
    if prefix_ok && !name.is_empty() && is_label_word(name) {
        Ok(key.to_owned())
    } else {
        Err(format!(
            "{key:?} is not a label key (an optional DNS prefix and '/', then up to 63 of a-z, 0-9, '-', '_', '.')"
        ))
    }
}

/// A label value: empty, or up to 63 characters as a key's name.
fn label_value(value: &str) -> Result<String, String> {
    if value.is_empty() || is_label_word(value) {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?} is not a label value (up to 63 of a-z, A-Z, 0-9, '-', '_', '.', alphanumeric at both ends)"
        ))
    }
}

fn is_label_word(word: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    word.len() <= 63
        && edge(word.chars().next())
        && edge(word.chars().last())
        && word.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}
