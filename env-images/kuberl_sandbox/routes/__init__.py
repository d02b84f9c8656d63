"""The sandbox server's HTTP routes, one router per concern; `kuberl_sandbox.api.create_app` mounts them."""
