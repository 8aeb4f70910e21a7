-- wrk script: spread requests over TENANTS tenants (X-Tenant header;
-- default 100), so the limiter works on many buckets as in production.
-- TENANTS=1 puts all traffic on one key (a hot tenant).
local tenants = tonumber(os.getenv("TENANTS") or "100")
local counter = 0
request = function()
	counter = counter + 1
	return wrk.format("GET", "/", { ["X-Tenant"] = "tenant-" .. (counter % tenants) })
end
