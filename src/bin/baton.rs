//! `baton`: the command-line client (not built yet; see issue 3).
fn main() {
    eprintln!("baton: the command-line client is not built yet");
    std::process::exit(2);
}
