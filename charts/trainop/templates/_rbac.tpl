{{/*
Generated from trainop.controller.rbac.GRANTS by `make crds`. Do not edit: tests/unit/test_chart_rbac.py
fails when this file differs from what that list renders, and the security tier checks, on a real
apiserver, what the ServiceAccount bound to the rendered ClusterRoles may and may not do.

THE permissions of the trainop operator: one list, independent of .Values (nothing below may read them;
tests/chart renders it with different values files and compares). charts/trainop/README.md lists the same
rules in a table, and tests/chart checks table and template against each other.

"trainop.rbac.namespacedRules" are granted cluster-wide (ClusterRoleBinding) or, with watchNamespaces,
per watched namespace (one RoleBinding per namespace to the same ClusterRole).
"trainop.rbac.clusterRules" are about cluster-scoped resources and always need a ClusterRoleBinding.
RBAC cannot confine writes to the objects trainop manages: templates/admission-policy.yaml does.
*/}}

{{- define "trainop.rbac.namespacedRules" -}}
# The API objects: kopf watches them; the operator reads one before reconciling it, patches its
# trainop.dev/applied-spec annotation, and deletes it once spec.ttlSecondsAfterFinished has passed.
- apiGroups: ["trainop.dev"]
  resources: ["trainingjobs", "tuningsweeps"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# Status subresource: the operator writes phase, conditions, attempts. It also creates each job's Role
# granting get+patch on that one job's status (for the trainer's rank 0); RBAC allows that without the
# escalate verb only because the operator holds both verbs itself.
- apiGroups: ["trainop.dev"]
  resources: ["trainingjobs/status", "tuningsweeps/status"]
  verbs: ["get", "patch"]
# Children carry controller ownerReferences with blockOwnerDeletion=true; clusters running the
# OwnerReferencesPermissionEnforcement admission plugin (e.g. OpenShift) require this to set them.
- apiGroups: ["trainop.dev"]
  resources: ["trainingjobs/finalizers", "tuningsweeps/finalizers"]
  verbs: ["update"]
# One RayJob per attempt: created, never patched (a RayJob's spec is fixed), other attempts' deleted;
# watched (the children cache), never read one by one.
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["list", "watch", "create", "delete"]
# Read-only, watched: KubeRay's RayCluster of a starting attempt tells why it is not ready (quota, pod
# creation failures).
- apiGroups: ["ray.io"]
  resources: ["rayclusters"]
  verbs: ["list", "watch"]
# The checkpoint claim: created once, never deleted by the operator (owner references do that); patched
# only to add the job's owner reference to a claim found under its name when deleteWithJob asks for one;
# watched to notice it bound, lost, created or being deleted.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["list", "watch", "create", "patch"]
# Read-only: the job's pods explain image-pull and scheduling problems on its status.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# The trainer's config: server-side applied once per attempt; read on an owner's first reconcile (not
# watched: listing every ConfigMap of the cluster is more than the operator may do).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch"]
# The job's ServiceAccount (its trainer's identity): server-side applied, watched.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["list", "watch", "create", "patch"]
# Each job's Role (get+patch on its own status only, create on Events for a profile's outcome) and its
# RoleBinding: server-side applied, watched.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["list", "watch", "create", "patch"]
# Events on jobs, posted by the operator (kopf's own posting is off; core/v1); the trainer's Role grants
# the same.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{- define "trainop.rbac.clusterRules" -}}
# kopf: discovers and follows CRDs (ours appearing, KubeRay's being installed later).
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
# kopf, with --namespace: resolves the names/patterns to namespaces and follows them coming and going
# (unused when serving all namespaces; kept so the list does not depend on values).
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
