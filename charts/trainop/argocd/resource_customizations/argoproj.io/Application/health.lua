-- Health of an argoproj.io/Application, for app-of-apps sync waves (examples/argocd/root.yaml).
--
-- Argo CD stopped assessing Applications' health by default (1.8), so a root Application moves to its
-- next sync wave without waiting for the child Applications of the previous one to become Healthy.
-- This check reports a child's own health, so the trainop operator's Application (wave -1) must be
-- Healthy before the TrainingJobs' Application (wave 1) syncs. Same sandbox rules as the trainop checks:
-- no string or math library.
local hs = {}
hs.status = "Progressing"
hs.message = ""
if obj.status ~= nil and obj.status.health ~= nil and obj.status.health.status ~= nil then
  hs.status = obj.status.health.status
  if obj.status.health.message ~= nil then
    hs.message = obj.status.health.message
  end
end
return hs
