"""Built-in workloads. Each is a factory ``build(**params) -> levers.Workload``."""

# built-in name -> "module:factory"
BUILTINS = {
    "demo": "levers.workloads.demo:build",
    "llama": "levers.workloads.llama:build",
    "hf": "levers.workloads.hf:build",
    "zoo": "levers.workloads.zoo:build",
    "arch": "levers.workloads.arch:build",
}
