"""`polyspec deploy k8s`: Kubernetes manifests (docs/scale-out.md#kubernetes). The command is polyspec.k8s.cli;
polyspec.k8s.sources reads the registry or the shipped drafts and renders the pure manifest functions of
polyspec.k8s.engines and polyspec.k8s.router with the settings of polyspec.k8s.settings."""
