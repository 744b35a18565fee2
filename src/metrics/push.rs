//! Pushing a run's metrics to a Prometheus Pushgateway, the convention for batch jobs: one
//! request per run, grouped by `job="lakecdc_<command>"` and `instance` (docs/operations.md,
//! "Metrics"). A run that succeeded replaces its group (`PUT`); a failed one only updates the
//! metrics it sends (`POST`), so the Pushgateway keeps the last success time of the run before.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::error::{Error, Result};

/// The longest a push may take, connection included.
const PUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of an error response's body kept for the message.
const ERROR_BODY_CHARS: usize = 200;

/// A Pushgateway: its base URL (never with credentials) and the `Authorization` header built
/// from the URL's `user:password@`, if any.
#[derive(Clone)]
pub struct Pushgateway {
    base: String,
    authorization: Option<String>,
}

impl std::fmt::Debug for Pushgateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pushgateway")
            .field("base", &self.base)
            .field("authorization", &self.authorization.as_ref().map(|_| "…"))
            .finish()
    }
}

impl Pushgateway {
    /// Parses `http(s)://[user[:password]@]host[:port][/path]`; the reason is one line
    /// naming the fix.
    pub fn parse(url: &str) -> std::result::Result<Self, String> {
        let (scheme, rest) = url
            .split_once("://")
            .filter(|(s, _)| matches!(*s, "http" | "https"))
            .ok_or("is not an http:// or https:// URL")?;
        if rest.contains(['?', '#']) || rest.chars().any(char::is_whitespace) {
            return Err("must be a base URL without query, fragment or spaces".into());
        }
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        // An `@` after the first `/` is most likely a password with a raw `/` in it: taking
        // the text before that `/` as the host would send the request elsewhere and put the
        // password in every message naming the URL.
        if path.contains('@') {
            return Err("has an '@' after its first '/': percent-encode a '/' in the user or password as %2F (and an '@' in the path as %40)".into());
        }
        let (userinfo, host) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        if host.is_empty() {
            return Err("names no host".into());
        }
        // `user:password`, each percent-decoded (RFC 3986), is what Basic authentication sends.
        let authorization = match userinfo {
            Some(u) => {
                let (user, password) = u.split_once(':').unwrap_or((u, ""));
                let mut credentials = percent_decoded(user)?;
                credentials.push(b':');
                credentials.extend(percent_decoded(password)?);
                Some(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(credentials)
                ))
            }
            None => None,
        };
        Ok(Self {
            base: format!("{scheme}://{host}{}", path.trim_end_matches('/')),
            authorization,
        })
    }

    /// Whether `url` may carry a password (`user:password@`): any `:` before its last `@`
    /// counts, wherever a raw `/` puts it (such a URL is refused by [`Pushgateway::parse`]
    /// anyway, but not before the flag is refused for its password).
    pub fn has_password(url: &str) -> bool {
        url.split_once("://")
            .and_then(|(_, rest)| rest.rsplit_once('@'))
            .is_some_and(|(userinfo, _)| userinfo.contains(':'))
    }

    /// The base URL, for messages (no credentials).
    pub fn describe(&self) -> &str {
        &self.base
    }

    /// The group's URL: `<base>/metrics/job/<job>/instance/<instance>` (both values are
    /// restricted to URL-safe characters when configured).
    pub fn group_url(&self, job: &str, instance: &str) -> String {
        format!("{}/metrics/job/{job}/instance/{instance}", self.base)
    }

    /// Sends `body` (the text format) to the group: `PUT` replaces the group, `POST` replaces
    /// only the metrics sent.
    pub async fn push(&self, job: &str, instance: &str, body: String, replace: bool) -> Result<()> {
        let url = self.group_url(job, instance);
        let failed = |reason: String| Error::Metrics {
            op: "push metrics to",
            target: url.clone(),
            reason,
        };
        let method = if replace {
            hyper::Method::PUT
        } else {
            hyper::Method::POST
        };
        let mut request = hyper::Request::builder().method(method).uri(&url).header(
            hyper::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        );
        if let Some(auth) = &self.authorization {
            request = request.header(hyper::header::AUTHORIZATION, auth);
        }
        let request = request
            .body(Full::new(bytes::Bytes::from(body)))
            .map_err(|e| failed(e.to_string()))?;
        let client: Client<_, Full<bytes::Bytes>> =
            Client::builder(TokioExecutor::new()).build(connector().map_err(&failed)?);
        let exchange = async {
            let response = client
                .request(request)
                .await
                .map_err(|e| failed(crate::error::causes(&e)))?;
            let status = response.status();
            if status.is_success() {
                return Ok(());
            }
            let body = response
                .into_body()
                .collect()
                .await
                .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                .unwrap_or_default();
            let body: String = body
                .chars()
                .filter(|c| !c.is_control())
                .take(ERROR_BODY_CHARS)
                .collect();
            Err(failed(format!("the Pushgateway answered {status}: {body}")))
        };
        tokio::time::timeout(PUSH_TIMEOUT, exchange)
            .await
            .map_err(|_| failed(format!("no answer within {}s", PUSH_TIMEOUT.as_secs())))?
    }
}

/// `s` percent-decoded; a `%` not followed by two hex digits is refused.
fn percent_decoded(s: &str) -> std::result::Result<Vec<u8>, String> {
    crate::config::percent_decode(s)
        .ok_or_else(|| "has a '%' in its credentials that is not %XX: percent-encode them".into())
}

/// An HTTP(S) connector verifying servers against the platform's CA roots.
fn connector() -> std::result::Result<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    String,
> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        // A malformed platform certificate is skipped, as every TLS client does.
        let _ = roots.add(cert);
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup failed: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed_and_credentials_kept_out_of_messages() {
        let gw = Pushgateway::parse("https://u:p%40ss@pgw.example:9091/base/").unwrap();
        assert_eq!(gw.describe(), "https://pgw.example:9091/base");
        assert_eq!(
            gw.group_url("lakecdc_flush", "host-1"),
            "https://pgw.example:9091/base/metrics/job/lakecdc_flush/instance/host-1"
        );
        // "u:p@ss", the password percent-decoded.
        assert_eq!(gw.authorization.as_deref(), Some("Basic dTpwQHNz"));
        assert!(Pushgateway::parse("https://u:p%4@h").is_err());
        assert!(!format!("{gw:?}").contains("dTpw"));
        assert!(Pushgateway::has_password("https://u:p@h"));
        assert!(!Pushgateway::has_password("https://u@h"));
        // A raw `/` in the password: refused without naming it, and counted as a password.
        let raw = "http://metrics:s3cr/etPW@127.0.0.1:9091";
        let e = Pushgateway::parse(raw).unwrap_err();
        assert!(!e.contains("etPW") && e.contains("%2F"), "{e}");
        assert!(Pushgateway::has_password(raw));
        assert!(Pushgateway::parse("https://h/a:b@c").is_err());
        for bad in [
            "ftp://h",
            "h:9091",
            "http://",
            "http://h/?x=1",
            "http://h/#f",
        ] {
            assert!(Pushgateway::parse(bad).is_err(), "{bad}");
        }
    }
}
