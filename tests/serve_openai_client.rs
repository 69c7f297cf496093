//! The official OpenAI Python client (`openai` from PyPI) reads `wgmoe serve`'s
//! log-probabilities: `tools/openai_client_check.py` runs completions (`logprobs: N`) and
//! chat (`logprobs` + `top_logprobs`), whole and streamed, and prompt scoring (`echo` with
//! `logprobs`, `max_tokens` 0) through the client's typed objects with its response
//! validation on where its types allow, against the OLMoE fixture.
//!
//! `WGMOE_OPENAI_PYTHON` names the interpreter that has `openai` (CI: a venv made by
//! `.ci/run`). Unset, the test prints "not run" and checks nothing; with
//! `WGMOE_REQUIRE_OPENAI=1` (CI sets it) that is a failure instead.

mod common;

use common::fixture;
use common::repo;
use common::server::*;

#[test]
fn openai_python_client_reads_logprobs() {
    let Some(python) = std::env::var_os("WGMOE_OPENAI_PYTHON") else {
        assert!(
            std::env::var_os("WGMOE_REQUIRE_OPENAI").is_none(),
            "WGMOE_REQUIRE_OPENAI is set and WGMOE_OPENAI_PYTHON is unset: name a Python \
             that has the `openai` package"
        );
        println!("not run: WGMOE_OPENAI_PYTHON is unset (.ci/run sets it)");
        return;
    };
    // --strict-model: the client's `model` must be the served name.
    let srv = Server::start(&fixture("olmoe-tiny"), &["--strict-model"]);
    let script = repo().join("tools/openai_client_check.py");
    let base_url = format!("{}/v1", srv.url);
    let out = std::process::Command::new(&python)
        .arg(&script)
        .args(["--base-url", base_url.as_str(), "--model", "olmoe-tiny"])
        // The client honours proxy variables; the server is on loopback.
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "WGMOE_OPENAI_PYTHON={}: cannot run it: {e}",
                python.to_string_lossy()
            )
        });
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("checks passed"),
        "{} {} failed ({}):\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}\n--- log ---\n{}",
        python.to_string_lossy(),
        script.display(),
        out.status,
        srv.stderr()
    );
}
