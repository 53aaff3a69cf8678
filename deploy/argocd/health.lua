-- Argo CD health check for pdoperator.io/PDDeployment (docs/gitops.md).
-- Reads what the operator writes: status.observedGeneration and the kstatus conditions
-- Ready, Reconciling and Stalled (exactly one of them is True once the operator has seen the
-- object). Degraded when Stalled, Progressing until the current generation is Ready.
local hs = {}

local function find(conditions, kind)
  if conditions == nil then
    return nil
  end
  for _, condition in ipairs(conditions) do
    if condition.type == kind then
      return condition
    end
  end
  return nil
end

local function describe(condition, fallback)
  if condition.message ~= nil and condition.message ~= "" then
    return condition.message
  end
  if condition.reason ~= nil and condition.reason ~= "" then
    return condition.reason
  end
  return fallback
end

if obj.status == nil or obj.status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe the PDDeployment"
  return hs
end

local generation = obj.metadata.generation
if generation ~= nil and obj.status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. generation ..
    " (observed " .. obj.status.observedGeneration .. ")"
  return hs
end

local conditions = obj.status.conditions
local stalled = find(conditions, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(stalled, "Stalled")
  return hs
end

local reconciling = find(conditions, "Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = describe(reconciling, "Reconciling")
  return hs
end

local ready = find(conditions, "Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready, "Ready")
  return hs
end

hs.status = "Progressing"
if ready ~= nil then
  hs.message = describe(ready, "Not ready")
else
  hs.message = "Waiting for the Ready condition"
end
return hs
