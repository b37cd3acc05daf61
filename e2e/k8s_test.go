package e2e

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/netns"
	"github.com/pipetrain/pipetrain/internal/testenv"
)

// No Kubernetes runs here, so TestKubernetesManifestsRun plays the cluster:
// it reads deploy/k8s/ as kubectl apply -f would, and starts every pod the
// Job (and then the JobSet) would make on a host of its own (a network
// namespace, internal/netns) with exactly what the manifests and Kubernetes
// give it, and nothing else:
//
//   - the init containers, to success, then the container: command and args
//     with Kubernetes' $(VAR) expansion, run as the image would: "pipetrain"
//     is found on the image's PATH where deploy/k8s/Dockerfile installs it,
//     and stands for the binary TestMain built (the image cannot be built
//     here), and the image's sh for this machine's (both Debian's dash);
//   - the environment: the image's PATH, what the runtime and the kubelet add
//     (HOSTNAME, the kubernetes Service's variables), the Job controller's
//     JOB_COMPLETION_INDEX, then the container's env; not the test's,
//     but for its OpenBLAS settings (hostBLASEnv);
//   - the host name the Job controller gives the pod (<job>-<index>; a
//     JobSet's Job is <jobset>-<replicated job>-<job index>), and an
//     /etc/hosts holding what the kubelet writes there plus, standing in for
//     the cluster DNS, the names the headless Service gives the pods it
//     selects (<hostname>.<subdomain>[.<namespace>.svc.cluster.local]);
//   - the volumes at their mountPaths, private to the pod: the ConfigMap's
//     keys and the Secret's as files (read-only), an emptyDir as an empty
//     folder of the pod's own.
//
// Not played: resources, the securityContext's user (the ranks run as root
// here), NetworkPolicy enforcement (its ports are checked against the ones
// the ranks listen on instead), restarts. Fields that would change how a rank
// starts and that the test does not play (envFrom, valueFrom, subPath,
// other kinds of volume, a second container, hostNetwork, hostAliases) fail
// the test rather than being ignored.

const (
	k8sDir = "../deploy/k8s"
	// k8sNamespace is where kubectl applies manifests that name none.
	k8sNamespace = "default"
	// imagePATH is debian:bookworm-slim's PATH, which the Dockerfile keeps.
	imagePATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// The Secret the docs (job.yaml's header) tell the user to create, with
	// kubectl create secret generic pipetrain-token --from-literal=token=...
	k8sSecret, k8sSecretKey = "pipetrain-token", "token"
)

type objectMeta struct {
	Name      string            `yaml:"name"`
	Namespace string            `yaml:"namespace"`
	Labels    map[string]string `yaml:"labels"`
}

type k8sObject struct {
	APIVersion string     `yaml:"apiVersion"`
	Kind       string     `yaml:"kind"`
	Metadata   objectMeta `yaml:"metadata"`
	file       string
	node       yaml.Node
}

type k8sConfigMap struct {
	Data map[string]string `yaml:"data"`
}

type k8sService struct {
	Spec struct {
		ClusterIP string            `yaml:"clusterIP"`
		Selector  map[string]string `yaml:"selector"`
	} `yaml:"spec"`
}

type labelSelector struct {
	MatchLabels      map[string]string `yaml:"matchLabels"`
	MatchExpressions []any             `yaml:"matchExpressions"`
}

// matches reports whether the selector selects labels; one with expressions
// is not played.
func (s labelSelector) matches(t *testing.T, labels map[string]string) bool {
	if len(s.MatchExpressions) > 0 {
		t.Fatalf("matchExpressions are not played by this test")
	}
	for k, v := range s.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

type k8sNetworkPolicy struct {
	Spec struct {
		PodSelector labelSelector `yaml:"podSelector"`
		Ingress     []struct {
			From []struct {
				PodSelector *labelSelector `yaml:"podSelector"`
			} `yaml:"from"`
			Ports []struct {
				Port int `yaml:"port"`
			} `yaml:"ports"`
		} `yaml:"ingress"`
	} `yaml:"spec"`
}

type k8sJobSpec struct {
	CompletionMode string `yaml:"completionMode"`
	Completions    int    `yaml:"completions"`
	Parallelism    int    `yaml:"parallelism"`
	Template       struct {
		Metadata objectMeta `yaml:"metadata"`
		Spec     podSpec    `yaml:"spec"`
	} `yaml:"template"`
}

type k8sJob struct {
	Spec k8sJobSpec `yaml:"spec"`
}

type k8sJobSet struct {
	Spec struct {
		Network struct {
			EnableDNSHostnames bool   `yaml:"enableDNSHostnames"`
			Subdomain          string `yaml:"subdomain"`
		} `yaml:"network"`
		ReplicatedJobs []struct {
			Name     string `yaml:"name"`
			Replicas int    `yaml:"replicas"`
			Template struct {
				Spec k8sJobSpec `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"replicatedJobs"`
	} `yaml:"spec"`
}

type podSpec struct {
	Hostname          string      `yaml:"hostname"`
	Subdomain         string      `yaml:"subdomain"`
	SetHostnameAsFQDN bool        `yaml:"setHostnameAsFQDN"`
	HostNetwork       bool        `yaml:"hostNetwork"`
	HostAliases       []any       `yaml:"hostAliases"`
	InitContainers    []container `yaml:"initContainers"`
	Containers        []container `yaml:"containers"`
	Volumes           []struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name  string `yaml:"name"`
			Items []any  `yaml:"items"`
		} `yaml:"configMap"`
		Secret *struct {
			SecretName string `yaml:"secretName"`
			Items      []any  `yaml:"items"`
		} `yaml:"secret"`
		EmptyDir *struct{} `yaml:"emptyDir"`
	} `yaml:"volumes"`
}

type container struct {
	Name       string   `yaml:"name"`
	Command    []string `yaml:"command"`
	Args       []string `yaml:"args"`
	WorkingDir string   `yaml:"workingDir"`
	Env        []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom any    `yaml:"valueFrom"`
	} `yaml:"env"`
	EnvFrom      []any `yaml:"envFrom"`
	VolumeMounts []struct {
		Name        string `yaml:"name"`
		MountPath   string `yaml:"mountPath"`
		ReadOnly    bool   `yaml:"readOnly"`
		SubPath     string `yaml:"subPath"`
		SubPathExpr string `yaml:"subPathExpr"`
	} `yaml:"volumeMounts"`
}

// readManifests reads every YAML document of the .yaml files in dir (not its
// subfolders: kubectl apply -f DIR does not descend).
func readManifests(t *testing.T, dir string) []*k8sObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s (%v)", dir, err)
	}
	var objs []*k8sObject
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			o := &k8sObject{file: f}
			if err := dec.Decode(&o.node); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if err := o.node.Decode(o); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.Kind == "" || o.APIVersion == "" || o.Metadata.Name == "" {
				t.Fatalf("%s: a document without apiVersion, kind or name: kubectl apply would refuse it", f)
			}
			if o.Metadata.Namespace != "" && o.Metadata.Namespace != k8sNamespace {
				t.Fatalf("%s: %s %s names namespace %s; the test plays %s", f, o.Kind, o.Metadata.Name, o.Metadata.Namespace, k8sNamespace)
			}
			objs = append(objs, o)
		}
	}
	return objs
}

// one finds the object of kind and name, decoded into out.
func one(t *testing.T, objs []*k8sObject, kind, name string, out any) {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind && o.Metadata.Name == name {
			if err := o.node.Decode(out); err != nil {
				t.Fatalf("%s: %v", o.file, err)
			}
			return
		}
	}
	t.Fatalf("no %s %s in the manifests", kind, name)
}

// ofKind lists the objects of kind.
func ofKind(objs []*k8sObject, kind string) []*k8sObject {
	var out []*k8sObject
	for _, o := range objs {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// k8sPod is a pod as Kubernetes would make it from a Job's template.
type k8sPod struct {
	index     int // JOB_COMPLETION_INDEX
	hostname  string
	subdomain string
	labels    map[string]string
	spec      podSpec
}

// jobPods are the pods the Job controller makes for an Indexed Job named
// name: host name <name>-<index> unless the template sets one, and the
// controller's labels added to the template's.
func jobPods(t *testing.T, name string, spec k8sJobSpec, labels map[string]string) []k8sPod {
	t.Helper()
	if spec.CompletionMode != "Indexed" {
		t.Fatalf("job %s: completionMode %q, want Indexed: without it pods get no JOB_COMPLETION_INDEX", name, spec.CompletionMode)
	}
	if spec.Parallelism != spec.Completions {
		t.Fatalf("job %s: parallelism %d, completions %d: every rank must run at once", name, spec.Parallelism, spec.Completions)
	}
	var pods []k8sPod
	for i := range spec.Completions {
		p := k8sPod{index: i, hostname: fmt.Sprintf("%s-%d", name, i), subdomain: spec.Template.Spec.Subdomain, spec: spec.Template.Spec, labels: map[string]string{}}
		if spec.Template.Spec.Hostname != "" {
			p.hostname = spec.Template.Spec.Hostname
		}
		maps.Copy(p.labels, spec.Template.Metadata.Labels)
		maps.Copy(p.labels, labels)
		maps.Copy(p.labels, map[string]string{"job-name": name, "batch.kubernetes.io/job-name": name,
			"batch.kubernetes.io/job-completion-index": strconv.Itoa(i)})
		pods = append(pods, p)
	}
	return pods
}

// k8sExpand is Kubernetes' expansion of command, args and env values:
// $(NAME) of a variable defined before it becomes its value, $$ a $, and
// anything else stays as written.
func k8sExpand(s string, env map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch {
		case s[i+1] == '$':
			b.WriteByte('$')
			i++
		case s[i+1] == '(':
			end := strings.IndexByte(s[i:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+end]
			if v, ok := env[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+end+1])
			}
			i += end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// k8sRun is what runPods returns: each pod's output and the backing folder
// of its --run-dir.
type k8sRun struct {
	outs    []*syncBuffer
	runDirs []string
	addrs   []string
}

// runPods starts pods as the kubelet would on hosts of their own, each
// with the DNS names dns gives it, and waits for them all to succeed.
func runPods(t *testing.T, pods []k8sPod, objs []*k8sObject, secrets map[string]map[string]string, dns func(k8sPod) []string) k8sRun {
	t.Helper()
	nw, err := netns.New(len(pods))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nw.Close(); err != nil {
			t.Error(err)
		}
	})
	hosts := nw.Hosts()
	// The cluster DNS, for every pod: the names of the pods the Service selects.
	var records strings.Builder
	records.WriteString("# Not the kubelet's: the cluster DNS's records, played by this test\n")
	for i, p := range pods {
		if names := dns(p); len(names) > 0 {
			fmt.Fprintf(&records, "%s\t%s\n", hosts[i].Addr, strings.Join(names, " "))
		}
	}
	dir := t.TempDir()
	res := k8sRun{}
	type running struct {
		done chan error
		out  *syncBuffer
	}
	var procs []running
	for i, p := range pods {
		h := hosts[i]
		h.Hostname = p.hostname
		podDir := filepath.Join(dir, p.hostname)
		mkdir(t, podDir)
		// The kubelet's /etc/hosts for a pod with a host name and a subdomain.
		etcHosts := "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
			"fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n"
		if p.subdomain != "" {
			etcHosts += fmt.Sprintf("%s\t%s.%s.%s.svc.cluster.local\t%s\n", h.Addr, p.hostname, p.subdomain, k8sNamespace, p.hostname)
		} else {
			etcHosts += fmt.Sprintf("%s\t%s\n", h.Addr, p.hostname)
		}
		etcHosts += records.String()
		writeFile(t, filepath.Join(podDir, "hosts"), etcHosts)
		if len(p.spec.Containers) != 1 {
			t.Fatalf("pod %s: %d containers; the test plays one (and init containers)", p.hostname, len(p.spec.Containers))
		}
		if p.spec.HostNetwork || p.spec.SetHostnameAsFQDN || len(p.spec.HostAliases) > 0 {
			t.Fatalf("pod %s: hostNetwork, setHostnameAsFQDN and hostAliases are not played", p.hostname)
		}
		// Volumes: each a folder of the pod's own.
		sources := map[string]string{}
		for _, v := range p.spec.Volumes {
			src := filepath.Join(podDir, "volumes", v.Name)
			mkdir(t, src)
			switch {
			case v.ConfigMap != nil && v.ConfigMap.Items == nil:
				var cm k8sConfigMap
				one(t, objs, "ConfigMap", v.ConfigMap.Name, &cm)
				for k, text := range cm.Data {
					writeFile(t, filepath.Join(src, k), text)
				}
			case v.Secret != nil && v.Secret.Items == nil:
				data, ok := secrets[v.Secret.SecretName]
				if !ok {
					t.Fatalf("pod %s: volume %s: Secret %s is not the one the docs create", p.hostname, v.Name, v.Secret.SecretName)
				}
				for k, text := range data {
					writeFile(t, filepath.Join(src, k), text)
				}
			case v.EmptyDir != nil:
			default:
				t.Fatalf("pod %s: volume %s is of a kind (or has items) the test does not play", p.hostname, v.Name)
			}
			sources[v.Name] = src
		}
		hostsFile := filepath.Join(podDir, "hosts")
		// Init containers run first, one after the other, each to success. A
		// variable one shares with the main container must agree with it
		// (one waits for MASTER_ADDR to resolve, the other then uses it).
		mainEnv := map[string]string{}
		for _, e := range p.spec.Containers[0].Env {
			mainEnv[e.Name] = e.Value
		}
		for _, c := range p.spec.InitContainers {
			for _, e := range c.Env {
				if v, ok := mainEnv[e.Name]; ok && v != e.Value {
					t.Fatalf("pod %s: init container %s has %s=%s, the container %s", p.hostname, c.Name, e.Name, e.Value, v)
				}
			}
			cmd, _, _ := containerCmd(t, h, p, c, sources, hostsFile)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("pod %s: init container %s: %v\n%s", p.hostname, c.Name, err, out)
			}
		}
		cmd, argv, mounts := containerCmd(t, h, p, p.spec.Containers[0], sources, hostsFile)
		runDir := flagValue(argv, "--run-dir")
		for _, m := range mounts {
			if rel, err := filepath.Rel(m.Target, runDir); err == nil && !strings.HasPrefix(rel, "..") && m.Target != "/etc/hosts" {
				res.runDirs = append(res.runDirs, filepath.Join(m.Source, rel))
			}
		}
		if len(res.runDirs) != i+1 {
			t.Fatalf("pod %s: --run-dir %q is on no volume: it would be in the container's own layer", p.hostname, runDir)
		}
		out, done := startCmd(t, cmd)
		procs = append(procs, running{done, out})
		res.outs = append(res.outs, out)
		res.addrs = append(res.addrs, h.Addr)
	}
	deadline := time.After(90 * time.Second)
	for i, p := range procs {
		select {
		case err := <-p.done:
			if err != nil {
				var all []string
				for j, q := range procs {
					all = append(all, fmt.Sprintf("--- pod %s:\n%s", pods[j].hostname, q.out.String()))
				}
				t.Fatalf("pod %s: %v\n%s", pods[i].hostname, err, strings.Join(all, "\n"))
			}
		case <-deadline:
			t.Fatalf("pod %s did not finish within 90s:\n%s", pods[i].hostname, p.out.String())
		}
	}
	return res
}

// containerCmd is container c of pod p as the kubelet starts it on host h:
// its volume mounts (sources: the pod's volumes' folders) and the kubelet's
// /etc/hosts, its environment, its command and args. It returns the
// command line and mounts too.
func containerCmd(t *testing.T, h *netns.Host, p k8sPod, c container, sources map[string]string, hostsFile string) (*exec.Cmd, []string, []netns.Mount) {
	t.Helper()
	mounts := []netns.Mount{{Source: hostsFile, Target: "/etc/hosts"}}
	for _, m := range c.VolumeMounts {
		src, ok := sources[m.Name]
		if !ok || m.SubPath != "" || m.SubPathExpr != "" || !filepath.IsAbs(m.MountPath) {
			t.Fatalf("pod %s: volume mount %+v: no such volume, or a subPath, or a relative path", p.hostname, m)
		}
		mounts = append(mounts, netns.Mount{Source: src, Target: m.MountPath, ReadOnly: m.ReadOnly})
	}
	// Environment: the image's, the runtime's and the kubelet's (the
	// kubernetes Service's variables come even with enableServiceLinks
	// false), then the container's with the Job controller's
	// JOB_COMPLETION_INDEX (a downward-API variable) at its end.
	if len(c.EnvFrom) > 0 {
		t.Fatalf("pod %s: envFrom is not played", p.hostname)
	}
	env := map[string]string{"PATH": imagePATH, "HOSTNAME": p.hostname,
		"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "KUBERNETES_SERVICE_PORT_HTTPS": "443",
		"KUBERNETES_PORT": "tcp://10.96.0.1:443", "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443",
		"KUBERNETES_PORT_443_TCP_PROTO": "tcp", "KUBERNETES_PORT_443_TCP_PORT": "443", "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1"}
	for _, kv := range hostBLASEnv() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			t.Fatalf("pod %s: env %s: valueFrom is not played", p.hostname, e.Name)
		}
		env[e.Name] = k8sExpand(e.Value, env)
	}
	env["JOB_COMPLETION_INDEX"] = strconv.Itoa(p.index)
	var environ []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		environ = append(environ, k+"="+env[k])
	}
	if len(c.Command) == 0 {
		t.Fatalf("pod %s: container %s has no command; the image's CMD is only pipetrain --help", p.hostname, c.Name)
	}
	var argv []string
	for _, a := range append(slices.Clone(c.Command), c.Args...) {
		argv = append(argv, k8sExpand(a, env))
	}
	prog := imageProgram(t, argv[0])
	cmd := h.Command(mounts, prog, argv[1:]...)
	cmd.Env, cmd.Dir = environ, c.WorkingDir
	if cmd.Dir == "" {
		cmd.Dir = "/" // the Dockerfile sets no WORKDIR
	}
	return cmd, argv, mounts
}

// imageProgram is the program of this machine that stands for the image's
// name: the image's pipetrain, which the Dockerfile must install on the
// image's PATH, is the binary TestMain built; the image's sh (Debian's dash)
// is this machine's (Debian's dash). Any other program fails the test.
func imageProgram(t *testing.T, name string) string {
	t.Helper()
	if name == "sh" || name == "/bin/sh" {
		return "/bin/sh"
	}
	b, err := os.ReadFile(filepath.Join(k8sDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^COPY --from=\S+ \S+ (\S+)\s*$`).FindAllStringSubmatch(string(b), -1)
	if len(m) == 0 {
		t.Fatal("the Dockerfile copies no binary into the image")
	}
	installed := m[len(m)-1][1]
	found := name == installed
	if !strings.Contains(name, "/") {
		found = filepath.Base(installed) == name && slices.Contains(strings.Split(imagePATH, ":"), filepath.Dir(installed))
	}
	if !found {
		t.Fatalf("the container runs %q, but the image has pipetrain at %s (PATH %s)", name, installed, imagePATH)
	}
	return binary
}

// flagValue is the value after flag in argv, "" if none.
func flagValue(argv []string, flag string) string {
	for i, a := range argv {
		if a == flag && i+1 < len(argv) {
			return argv[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkRanks requires each pod to have run as its rank, found the others
// through the rendezvous at master, and listened on its own address.
func checkRanks(t *testing.T, cfg *configs.Config, run k8sRun, pods []k8sPod, master string, stagePorts []int) {
	t.Helper()
	for i, out := range run.outs {
		text := out.String()
		name := cfg.ProcessName(cfg.Position(pods[i].index))
		wants := []string{
			fmt.Sprintf("pipetrain: rank %d of %d from JOB_COMPLETION_INDEX (Kubernetes Indexed Job): %s\n", pods[i].index, len(pods), name),
			fmt.Sprintf("pipetrain: %s listens on %s:%d; the rendezvous at %s gave every process's address", name, run.addrs[i], stagePorts[i], master),
			name + ": done",
		}
		for _, want := range wants {
			if !strings.Contains(text, want) {
				t.Errorf("pod %s's log lacks %q:\n%s", pods[i].hostname, want, text)
			}
		}
	}
}

// TestKubernetesManifestsRun plays deploy/k8s/ (the Job, its headless
// Service, the ConfigMap, the NetworkPolicy) and then deploy/k8s/jobset/
// on one network namespace per pod (see the comment at the top of this
// file), and requires each run to equal pipetrain reference on the
// ConfigMap's config, bit for bit.
func TestKubernetesManifestsRun(t *testing.T) {
	objs := readManifests(t, k8sDir)
	if js := ofKind(objs, "JobSet"); len(js) > 0 {
		t.Fatalf("%s holds a JobSet: kubectl apply -f %s would start it beside the Job", js[0].file, k8sDir)
	}
	jobs := ofKind(objs, "Job")
	if len(jobs) != 1 {
		t.Fatalf("%d Jobs in %s, want 1", len(jobs), k8sDir)
	}
	var job k8sJob
	one(t, objs, "Job", jobs[0].Metadata.Name, &job)
	jobName := jobs[0].Metadata.Name
	pods := jobPods(t, jobName, job.Spec, nil)
	if len(job.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("job %s: %d containers, want 1", jobName, len(job.Spec.Template.Spec.Containers))
	}
	c := job.Spec.Template.Spec.Containers[0]

	// The config the pods load: the ConfigMap key the container's --config
	// names, at the volume's mountPath.
	cfgPath := flagValue(append(slices.Clone(c.Command), c.Args...), "--config")
	var cfgText string
	for _, m := range c.VolumeMounts {
		if filepath.Dir(cfgPath) == m.MountPath {
			for _, v := range job.Spec.Template.Spec.Volumes {
				if v.Name == m.Name && v.ConfigMap != nil {
					var cm k8sConfigMap
					one(t, objs, "ConfigMap", v.ConfigMap.Name, &cm)
					cfgText = cm.Data[filepath.Base(cfgPath)]
				}
			}
		}
	}
	if cfgText == "" {
		t.Fatalf("--config %s is no key of a ConfigMap mounted in the container", cfgPath)
	}
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "config.yaml")
	writeFile(t, cfgFile, cfgText)
	// The Secret, as the docs make it: a random token under the key token.
	header, _ := os.ReadFile(jobs[0].file)
	if want := "kubectl create secret generic " + k8sSecret + " --from-literal=" + k8sSecretKey + "="; !strings.Contains(string(header), want) {
		t.Fatalf("%s does not tell how to make the Secret (%q)", jobs[0].file, want)
	}
	token := make([]byte, 32)
	rand.Read(token)
	secrets := map[string]map[string]string{k8sSecret: {k8sSecretKey: hex.EncodeToString(token)}}
	tokenFile := filepath.Join(dir, "token")
	writeFile(t, tokenFile, secrets[k8sSecret][k8sSecretKey])

	// What the cluster must agree with: one pod per process, every stage on
	// a fixed port (auto:PORT) that the NetworkPolicy lets the ranks reach,
	// as it must the rendezvous's port.
	cfg, err := configs.LoadUnchecked(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Processes() != len(pods) {
		t.Fatalf("the config has %d processes, the Job %d pods", cfg.Processes(), len(pods))
	}
	var stagePorts []int
	for rank := range cfg.Processes() {
		port, auto := configs.AutoPort(cfg.Address(cfg.Position(rank)))
		if !auto || port == 0 {
			t.Fatalf("rank %d's address %q: a pod's address is not known in advance; give auto:PORT", rank, cfg.Address(cfg.Position(rank)))
		}
		stagePorts = append(stagePorts, port)
	}
	master := rendezvousOf(t, cfg, c)
	_, port, err := net.SplitHostPort(master)
	masterPort, _ := strconv.Atoi(port)
	if err != nil || masterPort == 0 {
		t.Fatalf("rendezvous %q: not host:port", master)
	}
	checkPolicies(t, objs, pods, append(slices.Clone(stagePorts), masterPort))
	// The headless Service named by the pods' subdomain gives DNS names to
	// the pods its selector selects.
	var svc k8sService
	one(t, objs, "Service", pods[0].subdomain, &svc)
	if svc.Spec.ClusterIP != "None" {
		t.Fatalf("Service %s has clusterIP %q: pods get DNS names only from a headless one (None)", pods[0].subdomain, svc.Spec.ClusterIP)
	}
	dns := func(p k8sPod) []string {
		if len(svc.Spec.Selector) == 0 || !(labelSelector{MatchLabels: svc.Spec.Selector}).matches(t, p.labels) {
			return nil
		}
		return podDNSNames(p)
	}

	if t.Failed() {
		return
	}
	needData(t)
	if why := netns.Available(); why != "" {
		testenv.RequireOrSkip(t, netns.Needs, why)
	}
	// The reference trains the ConfigMap's config as it is, but for where
	// the token is: the Secret's mountPath exists only in the pods.
	refDir := t.TempDir()
	if r := run(t, 2*time.Minute, []string{"PIPETRAIN_TRANSPORT_TOKEN_FILE=" + tokenFile}, "reference", "--pipeline-threads", "--config", cfgFile, "--run-dir", refDir); r.err != nil {
		t.Fatalf("reference: %v\n%s", r.err, r.out)
	}

	t.Run("Job", func(t *testing.T) {
		res := runPods(t, pods, objs, secrets, dns)
		checkRanks(t, cfg, res, pods, master, stagePorts)
		// Rank 0's emptyDir holds every rank's logs and weights: the
		// ranks sent theirs at the end of the run.
		sameRun(t, refDir, res.runDirs[0], cfg.Train.Steps)
	})

	// The JobSet (applied with ../'s ConfigMap and NetworkPolicy) must start
	// the same ranks: its Job's pods, named by the JobSet, loading the same
	// config, finding rank 0 by the JobSet's DNS names.
	t.Run("JobSet", func(t *testing.T) {
		jsObjs := readManifests(t, filepath.Join(k8sDir, "jobset"))
		all := append(slices.Concat(ofKind(objs, "ConfigMap"), ofKind(objs, "NetworkPolicy")), jsObjs...)
		sets := ofKind(jsObjs, "JobSet")
		if len(sets) != 1 || len(jsObjs) != 1 {
			t.Fatalf("%s/jobset holds %d objects, %d of them JobSets; want the JobSet alone", k8sDir, len(jsObjs), len(sets))
		}
		var js k8sJobSet
		one(t, all, "JobSet", sets[0].Metadata.Name, &js)
		name := sets[0].Metadata.Name
		var pods []k8sPod
		for _, rj := range js.Spec.ReplicatedJobs {
			for j := range rj.Replicas {
				// The JobSet controller names the Job, labels its pods and,
				// with DNS host names, gives them the JobSet's subdomain.
				jobName := fmt.Sprintf("%s-%s-%d", name, rj.Name, j)
				labels := map[string]string{"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": rj.Name,
					"jobset.sigs.k8s.io/job-index": strconv.Itoa(j)}
				for _, p := range jobPods(t, jobName, rj.Template.Spec, labels) {
					if js.Spec.Network.EnableDNSHostnames {
						p.subdomain = cmp.Or(js.Spec.Network.Subdomain, name)
					}
					pods = append(pods, p)
				}
			}
		}
		if len(pods) != cfg.Processes() {
			t.Fatalf("the JobSet makes %d pods, the config has %d processes", len(pods), cfg.Processes())
		}
		if len(pods[0].spec.Containers) != 1 {
			t.Fatalf("the JobSet's pods have %d containers, want 1", len(pods[0].spec.Containers))
		}
		c := pods[0].spec.Containers[0]
		if got := flagValue(append(slices.Clone(c.Command), c.Args...), "--config"); got != cfgPath {
			t.Fatalf("the JobSet's pods load %s, the Job's %s", got, cfgPath)
		}
		master := rendezvousOf(t, cfg, c)
		_, port, _ := net.SplitHostPort(master)
		masterPort, _ := strconv.Atoi(port)
		checkPolicies(t, all, pods, append(slices.Clone(stagePorts), masterPort))
		dns := func(p k8sPod) []string {
			if !js.Spec.Network.EnableDNSHostnames {
				return nil
			}
			return podDNSNames(p)
		}
		res := runPods(t, pods, all, secrets, dns)
		checkRanks(t, cfg, res, pods, master, stagePorts)
		// Rank 0's emptyDir holds every rank's logs and weights: the
		// ranks sent theirs at the end of the run.
		sameRun(t, refDir, res.runDirs[0], cfg.Train.Steps)
	})
}

// podDNSNames are the names the cluster DNS gives a pod with a host name and
// a subdomain (a headless Service's name).
func podDNSNames(p k8sPod) []string {
	short := p.hostname + "." + p.subdomain
	return []string{short, short + "." + k8sNamespace + ".svc", short + "." + k8sNamespace + ".svc.cluster.local"}
}

// rendezvousOf is where the container's ranks meet: the config's
// rendezvous, else the container's MASTER_ADDR:MASTER_PORT.
func rendezvousOf(t *testing.T, cfg *configs.Config, c container) string {
	t.Helper()
	if cfg.Rendezvous != "" {
		return cfg.Rendezvous
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = k8sExpand(e.Value, env)
	}
	if env["MASTER_ADDR"] == "" || env["MASTER_PORT"] == "" {
		t.Fatalf("container %s sets no MASTER_ADDR and MASTER_PORT, and the config no rendezvous", c.Name)
	}
	return env["MASTER_ADDR"] + ":" + env["MASTER_PORT"]
}

// checkPolicies requires every NetworkPolicy that selects the pods (all
// alike) to let them reach each other on ports.
func checkPolicies(t *testing.T, objs []*k8sObject, pods []k8sPod, ports []int) {
	t.Helper()
	slices.Sort(ports)
	ports = slices.Compact(ports)
	for _, o := range ofKind(objs, "NetworkPolicy") {
		var np k8sNetworkPolicy
		if err := o.node.Decode(&np); err != nil {
			t.Fatalf("%s: %v", o.file, err)
		}
		if !np.Spec.PodSelector.matches(t, pods[0].labels) {
			continue // not the pods' policy
		}
		open, all := map[int]bool{}, false
		for _, in := range np.Spec.Ingress {
			fromRanks := len(in.From) == 0
			for _, f := range in.From {
				fromRanks = fromRanks || (f.PodSelector != nil && f.PodSelector.matches(t, pods[0].labels))
			}
			if !fromRanks {
				continue
			}
			all = all || len(in.Ports) == 0
			for _, p := range in.Ports {
				open[p.Port] = true
			}
		}
		for _, port := range ports {
			if !all && !open[port] {
				t.Errorf("NetworkPolicy %s keeps the ranks from each other's port %d", o.Metadata.Name, port)
			}
		}
	}
}
