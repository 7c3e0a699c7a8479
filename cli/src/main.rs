//! `ferrolb`: see the library.

fn main() -> std::process::ExitCode {
    ferrolb_cli::main()
}
