//! `kubectl-ferrolb`: the same program, found on PATH by kubectl as the plugin `kubectl ferrolb`.

fn main() -> std::process::ExitCode {
    ferrolb_cli::main()
}
