package deploy_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/config"
)

// manifests are the objects of deploy/kubernetes/*.yaml, each decoded
// into its k8s.io/api type by decodeStrict.
type manifests struct {
	namespaces  []corev1.Namespace
	configMaps  []corev1.ConfigMap
	deployments []appsv1.Deployment
	services    []corev1.Service
	pdbs        []policyv1.PodDisruptionBudget
	pvcs        []corev1.PersistentVolumeClaim
	files       []string // the object files, not kustomization.yaml
}

// decodeStrict decodes a YAML document as the API server does with
// strict field validation: field names match case-sensitively, and an
// unknown field, a duplicate key or a value of the wrong type fails.
func decodeStrict(doc []byte, dst any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, dst, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

func readManifests(t *testing.T) *manifests {
	t.Helper()
	paths, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	m := &manifests{}
	for _, p := range paths {
		if filepath.Base(p) == "kustomization.yaml" {
			continue
		}
		m.files = append(m.files, filepath.Base(p))
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		m.decode(t, p, b)
	}
	return m
}

// decode adds the objects of a YAML stream to m.
func (m *manifests) decode(t *testing.T, p string, b []byte) {
	t.Helper()
	for i, doc := range strings.Split(string(b), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s: document %d: %v", p, i, err)
		}
		var dst any
		switch meta.APIVersion + " " + meta.Kind {
		case "v1 Namespace":
			m.namespaces = append(m.namespaces, corev1.Namespace{})
			dst = &m.namespaces[len(m.namespaces)-1]
		case "v1 ConfigMap":
			m.configMaps = append(m.configMaps, corev1.ConfigMap{})
			dst = &m.configMaps[len(m.configMaps)-1]
		case "apps/v1 Deployment":
			m.deployments = append(m.deployments, appsv1.Deployment{})
			dst = &m.deployments[len(m.deployments)-1]
		case "v1 Service":
			m.services = append(m.services, corev1.Service{})
			dst = &m.services[len(m.services)-1]
		case "policy/v1 PodDisruptionBudget":
			m.pdbs = append(m.pdbs, policyv1.PodDisruptionBudget{})
			dst = &m.pdbs[len(m.pdbs)-1]
		case "v1 PersistentVolumeClaim":
			m.pvcs = append(m.pvcs, corev1.PersistentVolumeClaim{})
			dst = &m.pvcs[len(m.pvcs)-1]
		default:
			t.Fatalf("%s: document %d: unexpected %s %s", p, i, meta.APIVersion, meta.Kind)
		}
		if err := decodeStrict([]byte(doc), dst); err != nil {
			t.Fatalf("%s: document %d (%s): %v", p, i, meta.Kind, err)
		}
	}
}

// TestKubernetesManifests validates deploy/kubernetes: each object
// against its API type, then what must hold between them (labels and
// selectors, ports and probes, the mounted limits) and the production
// settings (probes, resources, a locked-down security context, a
// disruption budget, limits that Sluice loads).
func TestKubernetesManifests(t *testing.T) {
	m := readManifests(t)
	if len(m.deployments) != 1 || len(m.services) != 1 || len(m.configMaps) != 1 || len(m.pdbs) != 1 || len(m.namespaces) != 1 {
		t.Fatalf("want one Namespace, Deployment, Service, ConfigMap and PodDisruptionBudget; have %d, %d, %d, %d, %d",
			len(m.namespaces), len(m.deployments), len(m.services), len(m.configMaps), len(m.pdbs))
	}
	ns := m.namespaces[0].Name
	d, svc, cm, pdb := m.deployments[0], m.services[0], m.configMaps[0], m.pdbs[0]
	for _, o := range []metav1.ObjectMeta{d.ObjectMeta, svc.ObjectMeta, cm.ObjectMeta, pdb.ObjectMeta} {
		if o.Namespace != ns {
			t.Errorf("%s in namespace %q, want %q", o.Name, o.Namespace, ns)
		}
	}

	// Selectors select the pods.
	pod := d.Spec.Template.Labels
	selects := func(sel map[string]string) bool {
		for k, v := range sel {
			if pod[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}
	if d.Spec.Selector == nil || !selects(d.Spec.Selector.MatchLabels) {
		t.Error("the Deployment's selector does not select its pods")
	}
	if !selects(svc.Spec.Selector) {
		t.Error("the Service does not select the pods")
	}
	if pdb.Spec.Selector == nil || !selects(pdb.Spec.Selector.MatchLabels) {
		t.Error("the PodDisruptionBudget does not select the pods")
	}
	if pdb.Spec.MinAvailable == nil && pdb.Spec.MaxUnavailable == nil {
		t.Error("the PodDisruptionBudget sets neither minAvailable nor maxUnavailable")
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Error("fewer than 2 replicas: a node drain stops rate limiting")
	}

	if len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(d.Spec.Template.Spec.Containers))
	}
	c := d.Spec.Template.Spec.Containers[0]
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["grpc"] != 8081 || ports["http"] != 8080 {
		t.Errorf("container ports %v, want grpc 8081 and http 8080", ports)
	}
	for _, p := range svc.Spec.Ports {
		if p.TargetPort.Type != intstr.String || ports[p.TargetPort.StrVal] == 0 {
			t.Errorf("Service port %s targets %s, not a named container port", p.Name, p.TargetPort.String())
		}
	}

	// Probes: gRPC health and /healthcheck.
	probes := map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe}
	var grpcProbe, httpProbe bool
	for name, p := range probes {
		if p == nil {
			t.Errorf("no %s probe", name)
			continue
		}
		switch {
		case p.GRPC != nil:
			grpcProbe = p.GRPC.Port == ports["grpc"]
		case p.HTTPGet != nil:
			httpProbe = p.HTTPGet.Path == "/healthcheck" && (p.HTTPGet.Port.StrVal == "http" || p.HTTPGet.Port.IntVal == ports["http"])
		}
	}
	if !grpcProbe || !httpProbe {
		t.Errorf("probes: gRPC health on the gRPC port %v, /healthcheck on the HTTP port %v; want both", grpcProbe, httpProbe)
	}

	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %v: want CPU and memory requests and a memory limit", c.Resources)
	}
	sc, psc := c.SecurityContext, d.Spec.Template.Spec.SecurityContext
	if sc == nil || psc == nil {
		t.Fatal("no security context")
	}
	if psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("the pod may run as root or without the runtime's seccomp profile")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Error("the container may escalate, write its root file system or keep capabilities")
	}
	if d.Spec.Template.Spec.TerminationGracePeriodSeconds == nil || *d.Spec.Template.Spec.TerminationGracePeriodSeconds <= 10 {
		t.Error("terminationGracePeriodSeconds must exceed --drain-timeout (10s)")
	}

	// The limits: the ConfigMap is mounted where --config points, and
	// Sluice loads what it holds.
	var mount string
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
			for _, vm := range c.VolumeMounts {
				if vm.Name == v.Name {
					mount = vm.MountPath
				}
			}
		}
	}
	if i := slices.Index(c.Args, "--config"); mount == "" || i < 0 || i+1 >= len(c.Args) || c.Args[i+1] != mount {
		t.Errorf("args %q: --config is not the ConfigMap's mount %q", c.Args, mount)
	}
	dir := t.TempDir()
	for name, data := range cm.Data {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := config.Load(dir, config.Options{}); err != nil {
		t.Errorf("the ConfigMap's limits do not load: %v", err)
	}

	// kustomization.yaml lists every file.
	b, err := os.ReadFile("kubernetes/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}
	if err := decodeStrict(b, &k); err != nil {
		t.Fatal(err)
	}
	slices.Sort(k.Resources)
	if k.Kind != "Kustomization" || !slices.Equal(k.Resources, m.files) {
		t.Errorf("kustomization.yaml lists %q, want %q", k.Resources, m.files)
	}
}

// TestKubernetesManifests_Strict: the decoding above refuses what the API
// server would, so that the test can fail.
func TestKubernetesManifests_Strict(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  replica: 2\n",                 // misspelt
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  replicas: two\n",              // wrong type
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  replicas: 1\n  replicas: 2\n", // duplicate
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  template:\n    spec:\n      containers:\n        - name: x\n          readinessprobe: {}\n",
	} {
		var d appsv1.Deployment
		if err := decodeStrict([]byte(doc), &d); err == nil {
			t.Errorf("accepted:\n%s", doc)
		}
	}
}

// TestKubernetesMemoryOverlay renders deploy/kubernetes-memory with
// kubectl's kustomize and checks the single replica it makes: the memory
// store, its snapshot on the claimed volume, stopped before its successor
// starts, and no disruption budget that would block drains.
func TestKubernetesMemoryOverlay(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not on PATH")
	}
	out, err := exec.Command(kubectl, "kustomize", "kubernetes-memory").Output()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v", err)
	}
	m := &manifests{}
	m.decode(t, "kubernetes-memory", out)
	if len(m.deployments) != 1 || len(m.pvcs) != 1 || len(m.pdbs) != 0 {
		t.Fatalf("%d Deployments, %d PersistentVolumeClaims, %d PodDisruptionBudgets; want 1, 1, 0", len(m.deployments), len(m.pvcs), len(m.pdbs))
	}
	d := m.deployments[0]
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("one replica %v, strategy %q: want true, Recreate (one replica, never two pods on one snapshot)", d.Spec.Replicas != nil && *d.Spec.Replicas == 1, d.Spec.Strategy.Type)
	}
	c := d.Spec.Template.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["SLUICE_STORE"] != "memory" || env["SLUICE_REDIS_URL"] != "" || env["SLUICE_MEMORY_SNAPSHOT"] == "" {
		t.Fatalf("env %v: want the memory store with SLUICE_MEMORY_SNAPSHOT and no Redis", env)
	}
	var claim string
	for _, vm := range c.VolumeMounts {
		if filepath.Dir(env["SLUICE_MEMORY_SNAPSHOT"]) != vm.MountPath || vm.ReadOnly {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == vm.Name && v.PersistentVolumeClaim != nil {
				claim = v.PersistentVolumeClaim.ClaimName
			}
		}
	}
	if claim == "" || claim != m.pvcs[0].Name || m.pvcs[0].Namespace != d.Namespace {
		t.Errorf("the snapshot %s is not on the claim %s/%s", env["SLUICE_MEMORY_SNAPSHOT"], m.pvcs[0].Namespace, m.pvcs[0].Name)
	}
	if g := d.Spec.Template.Spec.SecurityContext.FSGroup; g == nil || *g != *d.Spec.Template.Spec.SecurityContext.RunAsGroup {
		t.Error("the volume is not writable by the container's group (fsGroup)")
	}
	if p := d.Spec.Template.Spec.TerminationGracePeriodSeconds; p == nil || *p <= 10 {
		t.Error("terminationGracePeriodSeconds must exceed --drain-timeout (10s) and leave time for the last write")
	}
}
