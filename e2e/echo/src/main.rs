//! `ferrolb-echo`: the lab pods' echo server as a program of its own, for the lab's container
//! image (`images/build-oci.sh --lab`).
//!
//! ```text
//! ferrolb-echo [--name NAME]
//! ```
//!
//! Answers with NAME: `--name`, else the `POD_NAME` environment variable (set from
//! `metadata.name` by the downward API in a pod), else the hostname (a pod's hostname is its
//! name too). Serves HTTP on TCP 8080 and a UDP echo on 8081 until killed.

use std::process::ExitCode;

const USAGE: &str = "usage: ferrolb-echo [--name NAME]

Serves HTTP on TCP 8080 (answers \"NAME CLIENT_IP\"; GET /stream answers NAME per line) and a UDP
echo on 8081 (answers NAME), until killed.

NAME: --name, else $POD_NAME, else the hostname (/proc/sys/kernel/hostname).";

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
enum Args {
    /// Serve, with `--name` when given.
    Serve(Option<String>),
    /// `-h`/`--help`.
    Help,
}

/// Parses the arguments after the program name.
fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut name = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let value = match arg.as_str() {
            "-h" | "--help" => return Ok(Args::Help),
            "--name" => args.next().ok_or("--name needs a value")?,
            other => match other.strip_prefix("--name=") {
                Some(v) => v.to_string(),
                None => return Err(format!("unknown argument {other:?}")),
            },
        };
        if value.is_empty() {
            return Err("--name must not be empty".into());
        }
        if name.replace(value).is_some() {
            return Err("--name given twice".into());
        }
    }
    Ok(Args::Serve(name))
}

/// The name to answer with: `flag`, else `pod_name` (non-empty), else `hostname` (trimmed,
/// non-empty).
fn choose_name(
    flag: Option<String>,
    pod_name: Option<String>,
    hostname: Option<String>,
) -> Option<String> {
    flag.or(pod_name.filter(|n| !n.is_empty())).or(hostname
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty()))
}

fn main() -> ExitCode {
    let flag = match parse(std::env::args().skip(1)) {
        Ok(Args::Serve(flag)) => flag,
        Ok(Args::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("ferrolb-echo: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let Some(name) = choose_name(
        flag,
        std::env::var("POD_NAME").ok(),
        std::fs::read_to_string("/proc/sys/kernel/hostname").ok(),
    ) else {
        eprintln!("ferrolb-echo: no name: pass --name NAME or set POD_NAME");
        return ExitCode::from(2);
    };
    eprintln!(
        "ferrolb-echo: {name} on TCP {} and UDP {}",
        ferrolb_echo::HTTP_PORT,
        ferrolb_echo::UDP_PORT
    );
    match ferrolb_echo::serve(&name) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferrolb-echo: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Result<Args, String> {
        parse(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn parses_the_name() {
        assert_eq!(args(&[]), Ok(Args::Serve(None)));
        assert_eq!(args(&["--name", "x"]), Ok(Args::Serve(Some("x".into()))));
        assert_eq!(args(&["--name=y"]), Ok(Args::Serve(Some("y".into()))));
        assert_eq!(args(&["--help"]), Ok(Args::Help));
    }

    #[test]
    fn refuses_bad_arguments() {
        assert!(args(&["--name"]).is_err());
        assert!(args(&["--name", ""]).is_err());
        assert!(args(&["--name", "a", "--name", "b"]).is_err());
        assert!(args(&["x"]).is_err());
        assert!(args(&["--port", "1"]).is_err());
    }

    #[test]
    fn flag_then_pod_name_then_hostname() {
        let s = |v: &str| Some(v.to_string());
        assert_eq!(choose_name(s("f"), s("p"), s("h\n")), s("f"));
        assert_eq!(choose_name(None, s("p"), s("h\n")), s("p"));
        assert_eq!(choose_name(None, s(""), s("h\n")), s("h"));
        assert_eq!(choose_name(None, None, s("h\n")), s("h"));
        assert_eq!(choose_name(None, None, s("\n")), None);
        assert_eq!(choose_name(None, None, None), None);
    }
}
