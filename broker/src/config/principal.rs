//! `ssl.principal.mapping.rules`: how a client certificate's subject becomes a principal's name, with
//! Kafka's syntax: a comma-separated list of `RULE:pattern/replacement/` (optionally followed by `L` or
//! `U` to lower- or upper-case the result) and `DEFAULT` (the subject's distinguished name as it is).
//! The first rule whose pattern matches the whole name gives it; when none matches the client is refused
//! (Kafka refuses too). The name the rules see is the subject in RFC 2253 form (`CN=app,O=Example,C=DE`),
//! as Kafka's `X500Principal.getName()` writes it.

use regex::Regex;

/// One rule.
#[derive(Debug, Clone)]
enum Rule {
    Default,
    Replace { pattern: Regex, replacement: String, case: Case },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Keep,
    Lower,
    Upper,
}

/// Parsed `ssl.principal.mapping.rules`.
#[derive(Debug, Clone)]
pub struct PrincipalRules {
    rules: Vec<Rule>,
}

impl PrincipalRules {
    /// Parses the rules; the error says what is wrong where.
    pub fn parse(text: &str) -> Result<PrincipalRules, String> {
        let mut rules = Vec::new();
        let mut rest = text.trim();
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("DEFAULT") {
                rules.push(Rule::Default);
                rest = after;
            } else if let Some(after) = rest.strip_prefix("RULE:") {
                let (pattern, after) = until_slash(after).ok_or_else(|| format!("unterminated pattern in {rest:?}"))?;
                let (replacement, after) =
                    until_slash(after).ok_or_else(|| format!("unterminated replacement in {rest:?}"))?;
                let (case, after) = match after.chars().next() {
                    Some('L') => (Case::Lower, &after[1..]),
                    Some('U') => (Case::Upper, &after[1..]),
                    _ => (Case::Keep, after),
                };
                let pattern =
                    Regex::new(&format!("^(?:{pattern})$")).map_err(|e| format!("pattern {pattern:?}: {e}"))?;
                rules.push(Rule::Replace { pattern, replacement, case });
                rest = after;
            } else {
                return Err(format!("{rest:?}: expected RULE:pattern/replacement/[LU] or DEFAULT"));
            }
            rest = rest.trim_start();
            match rest.strip_prefix(',') {
                Some(after) => rest = after.trim_start(),
                None if rest.is_empty() => {}
                None => return Err(format!("{rest:?}: rules are separated by commas")),
            }
        }
        if rules.is_empty() {
            return Err("no rule given (DEFAULT keeps the subject as it is)".into());
        }
        Ok(PrincipalRules { rules })
    }

    /// The principal's name for a subject (RFC 2253 form); `None` when no rule matches.
    pub fn apply(&self, subject: &str) -> Option<String> {
        self.rules.iter().find_map(|rule| match rule {
            Rule::Default => Some(subject.to_string()),
            Rule::Replace { pattern, replacement, case } => {
                let captures = pattern.captures(subject)?;
                let mut out = String::new();
                captures.expand(replacement, &mut out);
                Some(match case {
                    Case::Keep => out,
                    Case::Lower => out.to_lowercase(),
                    Case::Upper => out.to_uppercase(),
                })
            }
        })
    }
}

/// The text up to the first `/` not escaped as `\/` (unescaped), and what follows that slash.
fn until_slash(text: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' if text[i + 1..].starts_with('/') => {
                out.push('/');
                chars.next();
            }
            '/' => return Some((out, &text[i + 1..])),
            c => out.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_keeps_the_distinguished_name() {
        let rules = PrincipalRules::parse("DEFAULT").unwrap();
        assert_eq!(rules.apply("CN=app,O=Example,C=DE").as_deref(), Some("CN=app,O=Example,C=DE"));
    }

    #[test]
    fn the_first_matching_rule_gives_the_name_with_its_case() {
        let rules =
            PrincipalRules::parse("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, RULE:^CN=([^,]*),O=(.*)$/$1@$2/U,DEFAULT")
                .unwrap();
        assert_eq!(rules.apply("CN=Billing,OU=ServiceUsers,O=Example").as_deref(), Some("billing"));
        assert_eq!(rules.apply("CN=app,O=example").as_deref(), Some("APP@EXAMPLE"));
        assert_eq!(rules.apply("C=DE").as_deref(), Some("C=DE"));
    }

    #[test]
    fn without_default_an_unmatched_subject_has_no_principal() {
        let rules = PrincipalRules::parse(r"RULE:^CN=([^,]*)\/x.*$/$1/").unwrap();
        assert_eq!(rules.apply("CN=a/x,O=b").as_deref(), Some("a"));
        assert_eq!(rules.apply("O=b"), None);
    }

    #[test]
    fn malformed_rules_are_refused() {
        for bad in ["", "RULE:abc", "RULE:abc/def", "DEFAULTS", "RULE:(/x/", "DEFAULT DEFAULT"] {
            assert!(PrincipalRules::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
