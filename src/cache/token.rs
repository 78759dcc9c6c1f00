//! An API server's opaque string (a uid, a resourceVersion) kept in fixed
//! bytes when it has its usual form. Kubernetes promises nothing about
//! either (clients must treat them as opaque), but in practice a uid is a
//! UUID and a resourceVersion etcd's revision: 16 and 8 bytes instead of a
//! 36- or 8-byte string behind a pointer. Any other form is kept as written,
//! and every form reads back exactly as it was given.

use std::fmt;

/// An opaque string from the API server, kept small when it can be.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Token {
    /// Canonical decimal (no sign, no leading zero).
    Number(u64),
    /// A lowercase hyphenated UUID.
    Uuid([u8; 16]),
    Text(Box<str>),
}

impl Token {
    pub(super) fn new(s: &str) -> Token {
        if let Some(n) = decimal(s) {
            return Token::Number(n);
        }
        if let Some(bytes) = uuid(s) {
            return Token::Uuid(bytes);
        }
        Token::Text(s.into())
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Number(n) => write!(f, "{n}"),
            Token::Uuid(b) => {
                for (i, byte) in b.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
            Token::Text(s) => f.write_str(s),
        }
    }
}

fn decimal(s: &str) -> Option<u64> {
    let canonical = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    canonical.then(|| s.parse().ok()).flatten()
}

fn uuid(s: &str) -> Option<[u8; 16]> {
    let s = s.as_bytes();
    let hyphens = [8, 13, 18, 23];
    if s.len() != 36 || hyphens.iter().any(|&i| s[i] != b'-') {
        return None;
    }
    let digits = s.iter().filter(|&&b| b != b'-');
    let lower_hex = |b: &u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    };
    let nibbles: Option<Vec<u8>> = digits.map(lower_hex).collect();
    let nibbles = nibbles.filter(|n| n.len() == 32)?;
    let mut bytes = [0; 16];
    for (byte, pair) in bytes.iter_mut().zip(nibbles.chunks(2)) {
        *byte = pair[0] << 4 | pair[1];
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_reads_back_as_given() {
        let cases = [
            ("0", "number"),
            ("1048576", "number"),
            ("18446744073709551615", "number"),
            ("18446744073709551616", "text"),
            ("007", "text"),
            ("", "text"),
            ("-1", "text"),
            ("5f0c2a4e-8d3b-4c1a-9e2f-000000000042", "uuid"),
            ("5F0C2A4E-8D3B-4C1A-9E2F-000000000042", "text"),
            ("5f0c2a4e-8d3b-4c1a-9e2f-00000000004", "text"),
            ("5f0c2a4e8d3b-4c1a-9e2f-0000000000042", "text"),
            ("uid-a", "text"),
        ];
        for (given, form) in cases {
            let token = Token::new(given);
            let kept = match token {
                Token::Number(_) => "number",
                Token::Uuid(_) => "uuid",
                Token::Text(_) => "text",
            };
            assert_eq!((token.to_string().as_str(), kept), (given, form), "{given:?}");
        }
    }

    #[test]
    fn equal_strings_make_equal_tokens() {
        let uid = "9a1b7c3d-2e4f-4a5b-8c6d-000000000007";
        let copy = String::from(uid);
        assert_eq!(Token::new(uid), Token::new(&copy));
        assert_ne!(Token::new(uid), Token::new("9a1b7c3d-2e4f-4a5b-8c6d-000000000008"));
        assert_eq!(std::mem::size_of::<Token>(), 24, "no bigger than the string it replaces");
    }
}
