//! The `resolvConf` option: a resolv.conf-format file turned into the result's DNS.
//!
//! Reads it the way the reference host-local does: `nameserver` takes its first argument,
//! `domain` the last one seen wins, `search` and `options` collect every argument, lines
//! starting with `#` or `;` and keywords without an argument are skipped.

use std::path::Path;

use super::error::IpamError;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpamDns {
    pub nameservers: Vec<String>,
    pub domain: Option<String>,
    pub search: Vec<String>,
    pub options: Vec<String>,
}

pub fn read_resolv_conf(path: &Path) -> Result<IpamDns, IpamError> {
    let text = std::fs::read_to_string(path).map_err(|source| IpamError::ResolvConf {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(parse_resolv_conf(&text))
}

pub fn parse_resolv_conf(text: &str) -> IpamDns {
    let mut dns = IpamDns::default();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(keyword), Some(first)) = (fields.next(), fields.next()) else {
            continue;
        };
        let all = std::iter::once(first).chain(fields).map(str::to_owned);
        match keyword {
            "nameserver" => dns.nameservers.push(first.to_owned()),
            "domain" => dns.domain = Some(first.to_owned()),
            "search" => dns.search.extend(all),
            "options" => dns.options.extend(all),
            _ => {}
        }
    }
    dns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_the_reference() {
        let text = "# comment\n; other comment\nnameserver 1.1.1.1\nnameserver 8.8.8.8 extra\r\n\
                    domain a.b\ndomain c.d ignored\nsearch x y\nsearch z\noptions ndots:5 rotate\nnameserver\nsortlist 1.2.3.4\n";
        assert_eq!(
            parse_resolv_conf(text),
            IpamDns {
                nameservers: vec!["1.1.1.1".into(), "8.8.8.8".into()],
                domain: Some("c.d".into()),
                search: vec!["x".into(), "y".into(), "z".into()],
                options: vec!["ndots:5".into(), "rotate".into()],
            }
        );
        assert_eq!(parse_resolv_conf(""), IpamDns::default());
    }

    #[test]
    fn missing_file_names_the_path() {
        let e = read_resolv_conf(Path::new("/nonexistent/resolv.conf")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "failed to read resolvConf /nonexistent/resolv.conf"
        );
        assert_eq!(e.cni_code(), crate::cni::error::code::IO_FAILURE);
    }
}
