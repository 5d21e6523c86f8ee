//! The fake MCP server as a local program: the tests' stand-in for the MCP servers
//! people run with `npx` or `uvx`, spoken to over stdin and stdout.

#[tokio::main(flavor = "current_thread")]
async fn main() {
    eprintln!("fake MCP server started");
    pulse_tests::fake_mcp::serve_stdio().await;
}
