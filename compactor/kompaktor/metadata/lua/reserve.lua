-- Poll and reserve in one call (docs/planner.md §6.4): reserve_next(ARGV) pops the first job of a
-- group's queue and applies the reserving mutation to it, skipping stale jobs, all atomically.
-- Part of the metadata library's preamble, after the key names K, the queues' functions
-- (queues/lua/lib.lua: refuse_stale takes the fencing token off ARGV) and mutate(spec)
-- (lua/mutate.lua); the library's reserving function calls it.
-- ARGV: group, call id, the most stale jobs to discard in this call, the ECID and the time (ms) of
-- the reservation, then pairs (job key, template): the job key is the job's kind, plus '+overlaps'
-- for a job flagged overlaps-selection; the template is the reserving mutation's spec as JSON
-- (built in Python, compactions.py: the one home of the conditions) with placeholder strings for
-- the job's and the call's values: "@tablet@", "@table@", "@files@" (oldest first), "@priority@",
-- "@selection@", "@ecid@", "@now@", and @tid@ (the table id) and @nonce@ (the ECID's) in the
-- output's name template; see compile and fill below.
-- A job of a key with no template is returned popped but not reserved: the client reserves it.
-- Returns JSON {n = stale jobs discarded, job? = the job popped, queued? = when its tablet was first
-- queued (ms; the history's queued time), res? = the mutation's outcome (reserved), more? = true
-- (the stale bound was reached with jobs left)}; a job whose mutation
-- is refused is discarded (counted in stale_jobs_discarded) and the next one popped. The outcome
-- is recorded under the call id, as a mutation's: a call resent after a broken connection gets it.

-- Templates decoded once: the library keeps each template it was sent (its JSON text -> the decoded
-- spec and where its placeholders stand), so a compactor decodes no template after its first
-- reservation (a template holds no per-call value: the ECID, the time and the job's values are
-- placeholders). A cache only, in the library's Lua state: a reload of the library starts it empty,
-- and past TEMPLATES_KEPT templates (compactors x kinds) it starts again.
local TEMPLATES_KEPT = 256
local templates_seen, templates_count = {}, 0
-- the placeholders standing for a whole value (anywhere in the spec), and the two standing inside
-- the output's name template ("template" of the add_running op's output naming)
local SLOTS = {['@tablet@'] = true, ['@table@'] = true, ['@files@'] = true, ['@priority@'] = true,
  ['@selection@'] = true, ['@ecid@'] = true, ['@now@'] = true}

local function compile(tmpl)
  local c = templates_seen[tmpl]
  if c then return c end
  c = {spec = cjson.decode(tmpl), slots = {}, names = {}}
  local function scan(t)
    for k, v in pairs(t) do
      if type(v) == 'table' then
        scan(v)
      elseif SLOTS[v] then
        c.slots[#c.slots + 1] = {t, k, v}
      elseif k == 'template' and type(v) == 'string' then
        c.names[#c.names + 1] = {t, k, v}
      end
    end
  end
  scan(c.spec)
  if templates_count >= TEMPLATES_KEPT then templates_seen, templates_count = {}, 0 end
  templates_seen[tmpl] = c
  templates_count = templates_count + 1
  return c
end

-- The job's spec: the template's placeholders given the job's values (the same decoded spec each
-- time: every placeholder is assigned on every call, and mutate changes nothing of it but the
-- add_running record's output, which it sets). One list of the files, shared by all that name
-- them. Cheap on purpose (it runs for every job reserved): an insertion sort, no decoding.
local function fill(tmpl, job, ecid, now)
  -- the files oldest first: by the name after its prefix letter (model.names.file_order_key),
  -- then by path (keys are unique in practice)
  local files, keys, n = {}, {}, 0
  for f, _ in pairs(job.files) do
    local k = string.sub(f, (string.match(f, '^.*/()') or 1) + 1)
    local i = n
    while i > 0 and (keys[i] > k or (keys[i] == k and files[i] > f)) do
      files[i + 1], keys[i + 1] = files[i], keys[i]
      i = i - 1
    end
    files[i + 1], keys[i + 1] = f, k
    n = n + 1
  end
  local tid = string.match(job.tablet, '^[^;]*')
  local sel = job.selection
  if isnull(sel) then sel = nil end
  local vals = {['@tablet@'] = job.tablet, ['@table@'] = tid, ['@files@'] = files, ['@priority@'] = job.priority,
    ['@selection@'] = sel, ['@ecid@'] = ecid, ['@now@'] = now}
  local c = compile(tmpl)
  for _, s in ipairs(c.slots) do
    local v = vals[s[3]]
    -- no selection: null as a condition's argument (a list), left out of a record, as Python does
    if v == nil and type(s[2]) == 'number' then v = cjson.null end
    s[1][s[2]] = v
  end
  local named = {tid = tid, nonce = string.match(ecid, '[^-]*$')}
  for _, s in ipairs(c.names) do
    s[1][s[2]] = string.gsub(s[3], '@(%a+)@', named)
  end
  return c.spec
end

local function reserve_next(ARGV)
  local refused = refuse_stale(ARGV) if refused then return refused end  -- the fencing token (lib.lua)
  local group, call_id, max_stale, ecid, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
  local done_key = K.mutation(call_id)
  local prev = redis.call('GET', done_key)
  if prev then return prev end
  local templates = {}
  for i = 6, #ARGV - 1, 2 do templates[ARGV[i]] = ARGV[i + 1] end

  local g = queue_keys(group)
  local stale = 0
  local out = nil
  while not out do
    local raw, job, found, added = poll_first(g)
    if not found then
      out = '{"n":' .. stale .. '}'
    elseif raw then
      local key = job.kind
      if job.overlaps == true then key = key .. '+overlaps' end
      local tmpl = templates[key]
      local queued = ''
      if added then queued = ',"queued":' .. string.format('%d', added) end
      if not tmpl then
        out = '{"n":' .. stale .. queued .. ',"job":' .. raw .. '}'
      else
        local res, ok = mutate(fill(tmpl, job, ecid, now))
        if ok then
          out = '{"n":' .. stale .. queued .. ',"job":' .. raw .. ',"res":' .. res .. '}'
        else
          stale = stale + 1
          if stale >= max_stale then out = '{"n":' .. stale .. ',"more":true}' end
        end
      end
    end
  end
  if stale > 0 then redis.call('HINCRBY', K.counters, 'stale_jobs_discarded', stale) end
  if out ~= '{"n":0}' then redis.call('SET', done_key, out, 'EX', 600) end
  return out
end
