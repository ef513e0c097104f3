-- Poll and reserve in one call (docs/planner.md §6.4): reserve_next(ARGV) pops the first job of a
-- group's queue and applies the reserving mutation to it, skipping stale jobs, all atomically.
-- Part of the metadata library's preamble, after the key names K, the queues' functions
-- (queues/lua/lib.lua: refuse_stale takes the fencing token off ARGV) and mutate(spec)
-- (lua/mutate.lua); the library's reserving function calls it.
-- ARGV: group, call id, the most stale jobs to discard in this call, then pairs (job key, template):
-- the job key is the job's kind, plus '+overlaps' for a job flagged overlaps-selection; the
-- template is the reserving mutation's spec as JSON (built in Python, compactions.py: the one home
-- of the conditions) with placeholder strings for the job's values: "@tablet@", "@table@",
-- "@files@" (oldest first), "@priority@", "@selection@", and @tid@ (the table id) in the output's
-- name; see fill below for where they may stand.
-- A job of a key with no template is returned popped but not reserved: the client reserves it.
-- Returns JSON {n = stale jobs discarded, job? = the job popped, res? = the mutation's outcome
-- (reserved), more? = true (the stale bound was reached with jobs left)}; a job whose mutation
-- is refused is discarded (counted in stale_jobs_discarded) and the next one popped. The outcome
-- is recorded under the call id, as a mutation's: a call resent after a broken connection gets it.

-- The job's spec: the template decoded, its placeholders replaced by the job's values where a
-- template may hold them (the table, the tablet's id, a condition's argument, the add_running
-- record and its output's name); one list of the files, shared by all that name them. Cheap on
-- purpose (it runs for every job reserved): an insertion sort, no pattern scans of the template.
local function fill(tmpl, job)
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
    ['@selection@'] = sel or cjson.null}
  local spec = cjson.decode(tmpl)
  if spec.table == '@table@' then spec.table = tid end
  for _, t in ipairs(spec.tablets) do
    if t.id == '@tablet@' then t.id = job.tablet end
    for _, c in ipairs(t.conds) do
      local x = vals[c[2]]
      if x ~= nil then c[2] = x end
    end
    for _, op in ipairs(t.ops) do
      if op[1] == 'add_running' then
        local rec = op[3]
        if rec.files == '@files@' then rec.files = files end
        if rec.priority == '@priority@' then rec.priority = job.priority end
        if rec.selection == '@selection@' then rec.selection = sel end  -- nil: left out, as Python does
        if type(op[4]) == 'table' and type(op[4].template) == 'string' then
          op[4].template = string.gsub(op[4].template, '@tid@', function() return tid end)
        end
      end
    end
  end
  return spec
end

local function reserve_next(ARGV)
  local refused = refuse_stale(ARGV) if refused then return refused end  -- the fencing token (lib.lua)
  local group, call_id, max_stale = ARGV[1], ARGV[2], tonumber(ARGV[3])
  local done_key = K.mutation(call_id)
  local prev = redis.call('GET', done_key)
  if prev then return prev end
  local templates = {}
  for i = 4, #ARGV - 1, 2 do templates[ARGV[i]] = ARGV[i + 1] end

  local g = queue_keys(group)
  local stale = 0
  local out = nil
  while not out do
    local raw, job, found = poll_first(g)
    if not found then
      out = '{"n":' .. stale .. '}'
    elseif raw then
      local key = job.kind
      if job.overlaps == true then key = key .. '+overlaps' end
      local tmpl = templates[key]
      if not tmpl then
        out = '{"n":' .. stale .. ',"job":' .. raw .. '}'
      else
        local res, ok = mutate(fill(tmpl, job))
        if ok then
          out = '{"n":' .. stale .. ',"job":' .. raw .. ',"res":' .. res .. '}'
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
