-- Argo CD health check for trainop.dev/TuningSweep.
--
-- Same reading as the TrainingJob check: a sweep runs to completion, so it is Healthy once it has
-- Succeeded; Pending, Provisioning, Running and Restarting are Progressing; Failed is Degraded;
-- Suspended is Suspended. A spec the operator refused (SpecValid or SpecApplied False) is Degraded.
-- A status written for an older spec (status.observedGeneration <
-- metadata.generation) is Progressing whatever its phase says, and so is an object being deleted.
--
-- Argo CD runs custom health checks without the string and math libraries (base, table and a safe os
-- only, unless useOpenLibs is set), so this script uses neither: only `..` on strings and integers.
local hs = {}
local meta = obj.metadata or {}
local status = obj.status

if meta.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "Being deleted"
  return hs
end

if status == nil or status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the trainop operator to accept the sweep"
  return hs
end

if meta.generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < meta.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the trainop operator to apply generation " .. meta.generation ..
    " (status describes generation " .. status.observedGeneration .. ", phase " .. status.phase .. ")"
  return hs
end

local function condition(wanted)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == wanted then
      return c
    end
  end
  return nil
end

-- ": <reason>: <message>" of the first of these conditions that is False, else "".
local function blocked_by(types)
  for _, wanted in ipairs(types) do
    local c = condition(wanted)
    if c ~= nil and c.status == "False" then
      local text = ": " .. (c.reason or wanted)
      if c.message ~= nil and c.message ~= "" then
        text = text .. ": " .. c.message
      end
      return text
    end
  end
  return ""
end

local function last_failure()
  local failures = status.failures
  if failures == nil or #failures == 0 then
    return nil
  end
  local failure = failures[#failures]
  local text = failure.reason or "Unknown"
  if failure.message ~= nil and failure.message ~= "" then
    text = text .. ": " .. failure.message
  end
  return text
end

-- "3/8 trials finished, 2 running" from status.trials; nil before the driver reported any.
local function trials()
  local t = status.trials
  if t == nil or t.total == nil then
    return nil
  end
  local finished = (t.succeeded or 0) + (t.failed or 0) + (t.earlyStopped or 0)
  return finished .. "/" .. t.total .. " trials finished, " .. (t.running or 0) .. " running"
end

local function restarts(count)
  if count == 1 then
    return "1 restart"
  end
  return count .. " restarts"
end

local function attempt()
  if status.attempt ~= nil and status.attempt > 0 then
    return " (attempt " .. status.attempt .. ")"
  end
  return ""
end

-- The operator refused the current spec (an immutable field changed, or an invalid edit) and keeps
-- running the previous one: what the manifest says is not what runs.
local refused = blocked_by({"SpecValid", "SpecApplied"})
if refused ~= "" then
  hs.status = "Degraded"
  hs.message = "Spec not applied" .. refused
  return hs
end

local phase = status.phase
if phase == "Pending" then
  hs.status = "Progressing"
  hs.message = "Pending: waiting for the operator to start the sweep" .. blocked_by({"StorageReady"})
elseif phase == "Provisioning" then
  hs.status = "Progressing"
  hs.message = "Provisioning the Ray cluster" .. attempt() .. blocked_by({"StorageReady", "RayClusterReady"})
elseif phase == "Running" then
  hs.status = "Progressing"
  hs.message = "Running" .. attempt()
  if trials() ~= nil then
    hs.message = hs.message .. ": " .. trials()
  end
elseif phase == "Restarting" then
  hs.status = "Progressing"
  hs.message = "Restarting the sweep driver" .. attempt()
  if last_failure() ~= nil then
    hs.message = hs.message .. " after " .. last_failure()
  end
elseif phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = "Suspended (spec.suspend is true)"
elseif phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = "Succeeded"
  if trials() ~= nil then
    hs.message = hs.message .. ": " .. trials()
  end
  if status.bestTrial ~= nil and status.bestTrial.id ~= nil then
    hs.message = hs.message .. "; best trial " .. status.bestTrial.id
  end
elseif phase == "Failed" then
  hs.status = "Degraded"
  hs.message = "Failed"
  if status.restarts ~= nil and status.restarts > 0 then
    hs.message = hs.message .. " after " .. restarts(status.restarts)
  end
  if last_failure() ~= nil then
    hs.message = hs.message .. ": " .. last_failure()
  end
else
  hs.status = "Unknown"
  hs.message = "Unknown phase " .. phase
end
return hs
