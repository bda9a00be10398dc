// Package deploy holds no code: its tests check Sluice's deployment
// files. kubernetes/ has plain manifests (Namespace, ConfigMap with the
// limits, Deployment, Service, PodDisruptionBudget, kustomization.yaml),
// checked by decoding each object strictly into its k8s.io/api type;
// kubernetes-memory/ is its overlay of one replica on the memory store with
// its snapshot on a volume, rendered by `kubectl kustomize` (skipped
// without kubectl) and checked the same way; the multi-arch image that the
// Containerfile at the repository's root builds (one manifest list:
// linux/amd64 and linux/arm64) is checked by TestImage when
// `make image-test` exports it.
package deploy
