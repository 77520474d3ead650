-- Deletes a history stream's oldest entries while their newest record is older than the
-- cutoff, at most a batch of them. Answers how many it deleted.
-- KEYS: history stream
-- ARGV: cutoff (ms), batch
local cutoff = tonumber(ARGV[1])
local deleted = 0
while deleted < tonumber(ARGV[2]) do
  local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)[1]
  if not first then
    break
  end
  local at
  for i = 1, #first[2], 2 do
    if first[2][i] == 'at' then
      at = tonumber(first[2][i + 1])
    end
  end
  if at == nil or at >= cutoff then
    break
  end
  redis.call('XDEL', KEYS[1], first[1])
  deleted = deleted + 1
end
return deleted
