"""The name deployments pass: ``--middleware vllm_specextend.auth.ApiKeyMiddleware``.

The middleware lives in ``serving.auth``; this module keeps the path that the
README, the Docker image, compose, the Kubernetes Deployment and users' own
command lines pass to ``--middleware``, so moving the code moved no flag.
"""

from vllm_specextend.serving.auth import KEY_ENV, ApiKeyMiddleware, check_key

__all__ = ["KEY_ENV", "ApiKeyMiddleware", "check_key"]
