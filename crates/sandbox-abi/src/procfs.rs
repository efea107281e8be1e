//! The one parser of `/proc/<pid>/stat` (fields after the command name).

/// The fields of `/proc/<pid>/stat` this project reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Field 3: the state letter (R, S, Z, ...).
    pub state: char,
    /// Field 4: the parent's PID.
    pub ppid: i32,
    /// Field 22: start time in clock ticks since boot.
    pub start_time: u64,
}

/// Parses the text of a `/proc/<pid>/stat` file. The command name may
/// contain spaces and parentheses, so fields are counted after the last ')'.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(Stat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// `/proc/<pid>/stat` of `pid`, or None when it does not exist.
pub fn stat(pid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The start time of `pid` (clock ticks since boot), or None.
pub fn start_time(pid: i32) -> Option<u64> {
    stat(pid).map(|s| s.start_time)
}

/// The state letter of `pid` (R, S, Z, ...), or None.
pub fn state(pid: i32) -> Option<char> {
    stat(pid).map(|s| s.state)
}

/// The parent PID of `pid`, or None.
pub fn parent(pid: i32) -> Option<i32> {
    stat(pid).map(|s| s.ppid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_with_parentheses_and_spaces() {
        let text = "42 (a) b (c)) S 7 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 10";
        assert_eq!(
            parse_stat(text),
            Some(Stat {
                state: 'S',
                ppid: 7,
                start_time: 123456
            })
        );
        assert_eq!(parse_stat("42 (x"), None);
    }

    #[test]
    fn this_process() {
        let me = std::process::id() as i32;
        let s = stat(me).unwrap();
        assert_eq!(
            s.ppid,
            rustix::process::Pid::as_raw(rustix::process::getppid())
        );
        assert_eq!(start_time(me), Some(s.start_time));
    }
}
