//! A recording HTTP server on a local port, for tests of what lakecdc sends over HTTP (the
//! Pushgateway's pushes, the S3 client's requests).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// Header names lower-cased, values trimmed, in the order sent.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The value of header `name` (lower case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Starts a server that records every request and answers each with `answer` (the whole
/// response, one per connection: it should say `connection: close`). Returns its
/// `http://host:port` and the requests received so far.
pub fn recording_server(answer: String) -> (String, Arc<Mutex<Vec<Request>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let got = Arc::new(Mutex::new(Vec::new()));
    let seen = got.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let mut parts = line.split_whitespace();
            let (method, path) = (
                parts.next().unwrap().to_string(),
                parts.next().unwrap().to_string(),
            );
            let mut headers = Vec::new();
            loop {
                let mut h = String::new();
                reader.read_line(&mut h).unwrap();
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                let (k, v) = h.split_once(':').unwrap();
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
            let mut request = Request {
                method,
                path,
                headers,
                body: Vec::new(),
            };
            let length = request
                .header("content-length")
                .map_or(0, |v| v.parse().unwrap());
            request.body = vec![0; length];
            reader.read_exact(&mut request.body).unwrap();
            seen.lock().unwrap().push(request);
            reader.get_mut().write_all(answer.as_bytes()).unwrap();
        }
    });
    (url, got)
}
