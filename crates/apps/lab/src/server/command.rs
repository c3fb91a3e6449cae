//! A user's server command (`--target`): its placeholders and one start's command line.

use iolab_sys::process::shell_quote;

use super::Launch;

/// The placeholders a `--target` command may use, and what each becomes.
pub const PLACEHOLDERS: [(&str, &str); 5] = [
    ("{addr}", "IP:PORT the lab chose for this start"),
    ("{ip}", "the IP alone"),
    ("{port}", "the port alone"),
    ("{root}", "the directory holding small.html and big.bin"),
    (
        "{dir}",
        "a scratch directory of this target (config, pid file)",
    ),
];

/// The command of one start: the placeholders replaced by this launch's values (paths
/// quoted for the shell when they need it). Other braces are left to the shell.
pub fn substitute(template: &str, l: &Launch) -> String {
    template
        .replace("{addr}", &l.addr.to_string())
        .replace("{ip}", &l.addr.ip().to_string())
        .replace("{port}", &l.addr.port().to_string())
        .replace("{root}", &shell_quote(&l.www.to_string_lossy()))
        .replace("{dir}", &shell_quote(&l.run_dir.to_string_lossy()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch() -> Launch {
        Launch {
            iolab: "/x/iolab".into(),
            www: "/r/my www".into(),
            run_dir: "/r/run/py".into(),
            addr: "127.0.0.1:8099".parse().unwrap(),
            workers: 1,
            backlog: 128,
            cpu: None,
            cpus: Vec::new(),
            netns: None,
        }
    }

    #[test]
    fn placeholders_become_this_starts_values() {
        let c = substitute(
            "python3 -m http.server {port} --bind {ip} --directory {root} # {addr} {dir} ${HOME} {x}",
            &launch(),
        );
        assert_eq!(
            c,
            "python3 -m http.server 8099 --bind 127.0.0.1 --directory '/r/my www' # 127.0.0.1:8099 /r/run/py ${HOME} {x}"
        );
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
