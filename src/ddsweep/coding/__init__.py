"""HumanEval coding eval: data, code extraction, sandboxed execution, runner and output comparison."""
