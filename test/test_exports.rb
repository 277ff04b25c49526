# frozen_string_literal: true

require "test_helper"
require "protobuf_reader"
require "firefox_checks"
require "stringio"
require "tmpdir"
require "json"
require "zlib"

# The exports for other viewers (pprof, Firefox Profiler, speedscope):
# their structure checked field by field, every stack rebuilt from them and
# compared with the raw samples, and the pprof file read by `go tool pprof`
# itself.
class TestExports < Minitest::Test
  include FirefoxChecks

  FRAMES = {
    1 => { name: "<main>", file: "/app/main.rb", line: 1 },
    2 => { name: "A#run", file: "/app/a.rb", line: 3 },
    3 => { name: "A#pow", file: "/app/a.rb", line: 9 },
    4 => { name: "Integer#times", file: "<cfunc>" },
    5 => { name: "(garbage collection)", file: "" },
    6 => { name: "(marking)", file: "" },
    7 => { name: "W#loop \"quoted\"\n", file: "/app/w.rb", line: 2 },
  }.freeze
  # [thread, stack (root first), time (us), state]
  SAMPLES = [
    [7, [1, 2, 3], 1000, :running], [8, [7], 1100, :blocked],
    [7, [1, 2, 3], 2000, :running], [8, [7, 4], 2100, :running],
    [7, [1, 2], 3000, :waiting], [8, [7, 4], 3100, :running],
    [7, [5, 6], 4000, :running], [8, [7], 4100, :blocked],
    [7, [1, 2, 3], 5000, :running],
  ].freeze

  # A two-thread raw result built by hand: raw groups consecutive samples
  # with the same stack, as stackprof's raw does.
  def fixture(states: true)
    raw = []
    raw_lines = []
    SAMPLES.chunk_while { |a, b| a[1] == b[1] }.each do |run|
      stack = run.first[1]
      raw.push(stack.size, *stack, run.size)
      raw_lines.push(stack.size, *stack.map { |id| FRAMES[id][:line] || 0 }, run.size)
    end
    result = {
      version: 1.2, mode: :wall, interval: 1000, samples: SAMPLES.size, gc_samples: 1, missed_samples: 0,
      metadata: { app: "shop", "build" => 42 }, started_at: 1_700_000_000_000_000, duration: 5500, pid: 4242,
      frames: FRAMES.transform_values { |f| f.merge(total_samples: 0, samples: 0) },
      threads: { 7 => { name: nil, samples: 5, main: true }, 8 => { name: "worker", samples: 4 } },
      raw: raw, raw_lines: raw_lines, raw_sample_threads: SAMPLES.map(&:first),
      raw_sample_timestamps: SAMPLES.map { |s| s[2] }, raw_timestamp_deltas: [500] + SAMPLES.each_cons(2).map { |a, b| b[2] - a[2] }
    }
    result[:raw_sample_states] = SAMPLES.map(&:last) if states
    result
  end

  def names_of(stack)
    stack.map { |id| FRAMES[id][:name] }
  end

  def pprof(result, **filters)
    io = StringIO.new
    Strobe::Report.new(result, **filters).print_pprof(io)
    ProtobufReader.profile(gunzip(io.string))
  end

  def firefox(result, **filters)
    io = StringIO.new
    Strobe::Report.new(result, **filters).print_firefox(io)
    JSON.parse(io.string)
  end

  def speedscope(result, **filters)
    io = StringIO.new
    Strobe::Report.new(result, **filters).print_speedscope(io)
    JSON.parse(io.string)
  end

  # ---- pprof ---------------------------------------------------------------

  def test_pprof_samples_locations_and_labels
    prof = pprof(fixture)
    assert_equal "", prof[:strings].first
    assert_equal [%w[samples count], %w[wall nanoseconds]], prof[:sample_types]
    assert_equal %w[wall nanoseconds], prof[:period_type]
    assert_equal 1_000_000, prof[:period]
    assert_equal 1_700_000_000_000_000_000, prof[:time_nanos]
    assert_equal 5_500_000, prof[:duration_nanos]
    assert_equal "wall", prof[:default_sample_type]
    assert_includes prof[:comments], "app: shop"
    assert_includes prof[:comments], "build: 42"

    # Rebuild every sample's stack (leaf first in pprof) with its labels.
    seen = Hash.new(0)
    prof[:samples].each do |sample|
      names = sample[:locations].map do |loc|
        lines = prof[:locations].fetch(loc)
        assert_equal 1, lines.size
        prof[:functions].fetch(lines.first.first)[:name]
      end
      labels = sample[:labels].to_h
      count, nanos = sample[:values]
      assert_equal count * 1_000_000, nanos
      seen[[labels["thread"], labels["thread_id"], labels["state"], names.reverse]] += count
    end
    expected = Hash.new(0)
    SAMPLES.each do |thread, stack, _, state|
      expected[[thread == 7 ? "main" : "worker", thread, state.to_s, names_of(stack)]] += 1
    end
    assert_equal expected, seen
  end

  def with_requests(result = fixture)
    result.merge(markers: [
      { type: :request, name: "GET /a", thread: 7, start: 500, end: 2500, data: { endpoint: "A#index" } },
      { type: :gc, name: "GC", thread: 7, start: 900, end: 1100, data: nil },
      { type: :request, name: "GET /b", thread: 8, start: 3000, end: 4200, data: nil },
      { type: :request, name: "GET /c", thread: 7, start: 2500, end: 5000, data: { endpoint: "B#show", status: 200 } },
      { type: :request, name: "GET /nowhere", thread: 99, start: 0, end: 9000, data: { endpoint: "Lost#x" } },
    ])
  end

  # A sample taken while its thread served a request (a request marker of
  # its thread spans its time) carries that request's endpoint as a label.
  def test_pprof_labels_each_sample_with_the_endpoint_it_served
    seen = Hash.new(0)
    prof = pprof(with_requests)
    prof[:samples].each do |sample|
      labels = sample[:labels].to_h
      seen[[labels["thread_id"], labels["endpoint"]]] += sample[:values].first
    end
    assert_equal({ [7, "A#index"] => 2, [7, "B#show"] => 3, [8, nil] => 2, [8, "GET /b"] => 2 }, seen)
    refute pprof(fixture)[:strings].include?("endpoint"), "no label without requests"

    Dir.mktmpdir do |dir|
      path = File.join(dir, "requests.pb.gz")
      Strobe.save(with_requests, path, format: :pprof)
      out, err, status = run_tool("go", "tool", "pprof", "-top", "-tagfocus=endpoint=B#show", "-sample_index=samples", path)
      assert status.success?, "go tool pprof failed: #{err}"
      assert_match(/Total samples = 9\b/, out)
      assert_match(/Showing nodes accounting for 3, 33\.33% of 9 total/, out, "-tagfocus keeps B#show's 3 samples")
      tags, err, status = run_tool("go", "tool", "pprof", "-tags", path)
      assert status.success?, "go tool pprof -tags failed: #{err}"
      assert_match(%r{endpoint: Total 7\.0ms\n\s+3\.0ms \(42\.86%\): B#show\n\s+2\.0ms \(28\.57%\): A#index\n\s+2\.0ms \(28\.57%\): GET /b\n},
                   tags)
    end
  end

  def test_pprof_functions_and_lines
    prof = pprof(fixture)
    pow = prof[:functions].values.find { |f| f[:name] == "A#pow" }
    assert_equal({ name: "A#pow", file: "/app/a.rb", start_line: 9 }, pow)
    pow_id = prof[:functions].key(pow)
    assert_equal [[[pow_id, 9]]], prof[:locations].values.select { |lines| lines.first.first == pow_id }
  end

  def test_pprof_object_and_custom_modes
    object = pprof(fixture.merge(mode: :object, interval: 10))
    assert_equal [%w[samples count], %w[objects count]], object[:sample_types]
    assert_equal 10, object[:period]
    assert(object[:samples].all? { |s| s[:values][1] == s[:values][0] * 10 })
    custom = pprof(fixture.merge(mode: :custom, interval: nil))
    assert_equal [%w[samples count]], custom[:sample_types]
    assert_equal SAMPLES.size, custom[:samples].sum { |s| s[:values].first }
  end

  def test_pprof_filters_give_dropped_frames_samples_to_callers
    prof = pprof(fixture, reject_names: [/A#pow/])
    refute(prof[:functions].values.any? { |f| f[:name] == "A#pow" })
    assert_equal SAMPLES.size, prof[:samples].sum { |s| s[:values].first }
  end

  def workload_result
    Strobe.run(mode: :cpu, raw: true, interval: 200) do
      worker = Thread.new { 4.times { 30_000.times.map { |i| i.to_s * 3 } } }
      worker.name = "worker"
      5.times { (1..4_000).reduce(:*) ; 20_000.times.sum }
      worker.join
    end
  end

  # `go tool pprof -top` reads the file and its per-function counts are the
  # text report's.
  def test_go_tool_pprof_top_matches_text_report
    skip_statistics_under_valgrind
    result = workload_result
    assert_operator result[:samples], :>, 20
    Dir.mktmpdir do |dir|
      path = File.join(dir, "cpu.pb.gz")
      Strobe.save(result, path, format: :pprof)
      out, err, status = run_tool("go", "tool", "pprof", "-top", "-nodecount=100000", "-nodefraction=0", "-edgefraction=0",
                                   "-sample_index=samples", path)
      assert status.success?, "go tool pprof failed: #{err}"
      pprof_rows = out.lines.filter_map do |line|
        m = line.match(/\A\s*(\d+)\s+\S+%\s+\S+%\s+(\d+)\s+\S+%\s+(.+)\n\z/) and [m[3], [m[1].to_i, m[2].to_i]]
      end.to_h
      report = Strobe::Report.new(result)
      by_name = report.rows.group_by(&:name)
      flat = by_name.transform_values { |rows| rows.sum(&:self_samples) }
      assert_equal flat.reject { |_, n| n.zero? }, pprof_rows.transform_values(&:first).reject { |_, n| n.zero? }
      by_name.each do |name, rows|
        next unless rows.size == 1 # one frame of that name: its total is pprof's cum

        assert_equal rows.first.total, pprof_rows.fetch(name).last, "cum of #{name}"
      end
      assert_match(/Total samples = #{result[:samples]}\b/, out)

      traces, err, status = run_tool("go", "tool", "pprof", "-traces", path)
      assert status.success?, "go tool pprof -traces failed: #{err}"
      names = traces.scan(/^\s+thread:\s+(.+)$/).flatten.uniq.sort
      sampled = result[:threads].select { |_, t| t[:samples].positive? }
      expected = sampled.map { |id, t| t[:name] || (t[:main] ? "main" : "thread #{id}") }.sort
      assert_equal expected, names
      assert_includes names, "main"
      assert_includes names, "worker"
    end
  end

  # ---- Firefox Profiler -----------------------------------------------------

  def test_firefox_tracks_stacks_times_and_categories
    doc = firefox(fixture)
    assert_firefox_invariants(doc)
    threads = doc["threads"]
    assert_equal %w[main worker], threads.map { |t| t["name"] }
    assert_equal [true, false], threads.map { |t| t["isMainThread"] }
    assert_equal [7, 8], threads.map { |t| t["tid"] }
    assert_equal %w[4242 4242], threads.map { |t| t["pid"] }
    [7, 8].each_with_index do |tid, i|
      mine = SAMPLES.select { |s| s[0] == tid }
      assert_equal mine.map { |s| names_of(s[1]) }, firefox_stacks(threads[i])
      # milliseconds from the start (first timestamp minus its delta)
      assert_equal(mine.map { |s| (s[2] - 500) / 1000.0 }, threads[i]["samples"]["time"])
    end
    meta = doc["meta"]
    assert_equal 1.0, meta["interval"]
    assert_equal 1_700_000_000_000.0, meta["startTime"]
    assert_in_delta 5.5, meta["profilingEndTime"]
    strobe = meta["extra"].find { |s| s["label"] == "Strobe" }["entries"].to_h { |e| [e["label"], e["value"]] }
    assert_equal({ "mode" => "wall", "interval" => 1000, "samples" => 9, "gc_samples" => 1, "missed_samples" => 0 }, strobe)
    metadata = meta["extra"].find { |s| s["label"] == "Metadata" }["entries"].to_h { |e| [e["label"], e["value"]] }
    assert_equal({ "app" => "shop", "build" => 42 }, metadata)

    categories = meta["categories"].map { |c| c["name"] }
    main = threads[0]
    leaf_category = main["samples"]["stack"].map { |s| categories[main["stackTable"]["category"][s]] }
    # running Ruby, running Ruby, waiting for the GVL, GC (marking), running Ruby
    assert_equal ["Ruby", "Ruby", "GVL wait", "GC", "Ruby"], leaf_category
    gc_stack = main["samples"]["stack"][3]
    assert_equal "Marking", meta["categories"][3]["subcategories"][main["stackTable"]["subcategory"][gc_stack]]
    worker = threads[1]
    worker_leaf = worker["samples"]["stack"].map { |s| categories[worker["stackTable"]["category"][s]] }
    assert_equal ["Idle", "C function", "C function", "Idle"], worker_leaf
  end

  # The marker timeline as each thread's markers table: times on the
  # samples' base, instants and intervals, GC pauses named for the
  # profiler's GC colours, a schema per type whose fields follow the values.
  def test_firefox_markers_on_their_threads_tracks
    result = fixture
    result[:markers] = [
      { type: :user, name: "load", thread: 7, start: 2500, end: nil,
        data: { rows: 3, ratio: 0.5, type: "x", ok: true, tags: %w[a b], none: nil } },
      { type: :request, name: "GET /items", thread: 8, start: 1500, end: 4500,
        data: { method: "GET", path: "/items", status: 200, endpoint: "ItemsController#index" } },
      { type: :gc, name: "GC", thread: 7, start: 3900, end: 4200,
        data: { phases: %w[marking sweeping], gc_by: "newobj", major_by: nil } },
      { type: :gc, name: "GC", thread: 7, start: 4300, end: 4350, data: { phases: %w[sweeping], gc_by: "newobj", major_by: nil } },
      { type: :gc, name: "GC", thread: 8, start: 1000, end: 1200, data: { phases: %w[marking], gc_by: "method", major_by: "force" } },
      { type: :user, name: "elsewhere", thread: 99, start: 6000, end: 7000, data: { rows: 1.5 } },
    ]
    doc = firefox(result)
    assert_firefox_invariants(doc)
    main, worker = doc["threads"]
    rows = lambda do |thread|
      m = thread["markers"]
      m["length"].times.map do |i|
        [thread["stringArray"][m["name"][i]], m["startTime"][i], m["endTime"][i], m["phase"][i],
         doc["meta"]["categories"][m["category"][i]]["name"]]
      end
    end
    # times in ms from the samples' start (500 us)
    assert_equal [["load", 2.0, nil, 0, "Other"], ["GCMinor", 3.4, 3.7, 1, "GC"], ["GCSlice", 3.8, 3.85, 1, "GC"],
                  ["elsewhere", 5.5, 6.5, 1, "Other"]], rows.call(main)
    assert_equal [["GCMajor", 0.5, 0.7, 1, "GC"], ["GET /items", 1.0, 4.0, 1, "Other"]], rows.call(worker)
    assert_in_delta 6.5, doc["meta"]["profilingEndTime"], 1e-9, "the timeline reaches the last marker"
    assert_equal({ "type" => "strobe:user", "rows" => 3, "ratio" => 0.5, "type_" => "x", "ok" => "true", "tags" => "a, b" },
                 main["markers"]["data"][0])
    assert_equal({ "type" => "strobe:request", "method" => "GET", "path" => "/items", "status" => 200,
                   "endpoint" => "ItemsController#index" }, worker["markers"]["data"][1])
    schemas = doc["meta"]["markerSchema"].to_h { |s| [s["name"], s["data"].to_h { |f| [f["key"] || f["label"], f["format"]] }] }
    assert_equal({ "rows" => "decimal", "ratio" => "decimal", "type_" => "string", "ok" => "string", "tags" => "string",
                   "none" => "string", "Description" => nil }, schemas["strobe:user"])
    assert_equal "integer", schemas["strobe:request"]["status"]
    assert_equal %w[strobe:user strobe:request strobe:gc].sort, schemas.keys.sort
  end

  def test_firefox_markers_without_samples_start_at_the_first_marker
    result = fixture.merge(raw: [], raw_lines: [], raw_sample_threads: [], raw_sample_timestamps: [], raw_timestamp_deltas: [],
                           raw_sample_states: [], samples: 0)
    result[:markers] = [{ type: :user, name: "late", thread: 7, start: 90_000, end: 92_000, data: nil }]
    doc = firefox(result)
    assert_firefox_invariants(doc)
    markers = doc["threads"][0]["markers"]
    assert_equal [[0.0], [2.0], [{ "type" => "strobe:user" }]], markers.values_at("startTime", "endTime", "data")
  end

  def test_firefox_rejects_malformed_markers
    [{ type: "user", name: "x", thread: 7, start: 1, end: nil, data: nil },
     { type: :user, name: "x", thread: 7, start: 5, end: 4, data: nil },
     { type: :user, name: "x", thread: 7, start: -1, end: nil, data: nil },
     { type: :user, name: "x", thread: 7, start: 1, end: nil, data: { obj: Object.new } },
     { type: :user, name: "x", thread: 7, start: 1, end: nil, data: { "k" => 1 } },
     "not a marker"].each do |marker|
      error = assert_raises(Strobe::ProfileError) { firefox(fixture.merge(markers: [marker])) }
      assert_match(/marker 0 is (malformed|not a Hash)/, error.message)
    end
    assert_raises(Strobe::ProfileError) { firefox(fixture.merge(markers: {})) }
  end

  def test_firefox_without_states_or_timestamps
    result = fixture(states: false)
    result.delete(:raw_sample_timestamps)
    doc = firefox(result)
    assert_firefox_invariants(doc)
    # times from raw_timestamp_deltas alone, as older stackprof results have
    deltas = result[:raw_timestamp_deltas]
    sums = deltas.each_with_index.map { |_, i| deltas[0..i].sum }
    mine = SAMPLES.each_index.select { |i| SAMPLES[i][0] == 7 }
    assert_equal(mine.map { |i| sums[i] / 1000.0 }, doc["threads"][0]["samples"]["time"])
  end

  def test_firefox_loads_a_stackprof_style_result_without_threads
    result = fixture(states: false).reject { |k, _| %i[threads raw_sample_threads started_at duration pid].include?(k) }
    doc = firefox(result)
    assert_firefox_invariants(doc)
    assert_equal ["main"], doc["threads"].map { |t| t["name"] }
    assert_equal SAMPLES.map { |s| names_of(s[1]) }, firefox_stacks(doc["threads"][0])
  end

  # ---- speedscope -----------------------------------------------------------

  def speedscope_stacks(doc, profile)
    frames = doc["shared"]["frames"]
    profile["samples"].map { |s| s.map { |i| frames.fetch(i)["name"] } }
  end

  def test_speedscope_profiles_per_thread
    doc = speedscope(fixture)
    assert_equal "https://www.speedscope.app/file-format-schema.json", doc["$schema"]
    profiles = doc["profiles"]
    assert_equal %w[main worker], profiles.map { |p| p["name"] }
    profiles.each do |p|
      assert_equal "sampled", p["type"]
      assert_equal "microseconds", p["unit"]
      assert_equal p["samples"].size, p["weights"].size
      assert_equal p["endValue"] - p["startValue"], p["weights"].sum
    end
    # main: runs of identical stacks merged, weights the time to the
    # thread's next sample (the last one an interval)
    main = profiles[0]
    assert_equal [["<main>", "A#run", "A#pow"], ["<main>", "A#run"], ["(garbage collection)", "(marking)"],
                  ["<main>", "A#run", "A#pow"]], speedscope_stacks(doc, main)
    assert_equal [2000, 1000, 1000, 1000], main["weights"]
    assert_equal 500, main["startValue"]
    worker = profiles[1]
    assert_equal [["W#loop \"quoted\"\n"], ["W#loop \"quoted\"\n", "Integer#times"], ["W#loop \"quoted\"\n"]],
                 speedscope_stacks(doc, worker)
    assert_equal 600, worker["startValue"]
    pow = doc["shared"]["frames"].find { |f| f["name"] == "A#pow" }
    assert_equal({ "name" => "A#pow", "file" => "/app/a.rb", "line" => 9 }, pow)
    assert_equal({ "name" => "Integer#times" }, doc["shared"]["frames"].find { |f| f["name"] == "Integer#times" })
  end

  SPEEDSCOPE = File.join(StrobeTestHelpers::ROOT, "tmp/node/node_modules/speedscope/dist/release")

  # speedscope's own app (the npm package `rake deps` installs) imports the
  # file in headless Chromium, offline, as its command line hands it one:
  # a script calling speedscope.loadFileFromBase64. Returns the page's
  # title, or the reason it failed.
  def speedscope_import(json, view: nil)
    index = File.join(SPEEDSCOPE, "index.html")
    assert File.exist?(index), "speedscope is needed for this test (`rake deps` installs it with npm)"
    Dir.mktmpdir do |dir|
      script = File.join(dir, "profile.js")
      # A real alert() would block headless Chromium: record it instead.
      File.write(script, "window.alert = function(m) { console.error('ALERT: ' + m); };\n" \
                         "speedscope.loadFileFromBase64('profile.json', '#{[json].pack('m0')}');\n")
      dom, console = chromium_dom("file://#{index}#localProfilePath=#{script}#{"&view=#{view}" if view}", console: true)
      problems = console.grep(/Uncaught|ALERT|Failed to load/)
      problems << "Something went wrong" if dom.include?("Something went wrong")
      problems << "nothing shown" unless dom.include?("Time Order")
      return [:failed, problems] unless problems.empty?

      [:loaded, dom]
    end
  end

  def test_speedscope_loads_in_headless_chromium
    result = workload_result
    outcome, dom = speedscope_import(Strobe::Native.export_speedscope(result, nil, nil), view: "sandwich")
    assert_equal :loaded, outcome, dom.inspect
    assert_includes dom, "<title>Strobe cpu profile - speedscope</title>"
    # the sandwich view lists frames by name, in an HTML table
    assert_includes dom, "TestExports#workload_result"

    outcome, = speedscope_import(Strobe::Native.export_speedscope(fixture, nil, nil))
    assert_equal :loaded, outcome
    # the check can fail: a frame index out of range is refused by speedscope
    broken = JSON.parse(Strobe::Native.export_speedscope(fixture, nil, nil))
    broken["profiles"][0]["samples"][0] = [999]
    outcome, problems = speedscope_import(JSON.generate(broken))
    assert_equal :failed, outcome
    assert_includes problems, "Something went wrong"
  end

  def test_speedscope_cpu_and_object_weights
    cpu = speedscope(fixture.merge(mode: :cpu, interval: 250))
    assert(cpu["profiles"].all? { |p| p["weights"].sum == 250 * SAMPLES.count { |s| s[0] == (p["name"] == "main" ? 7 : 8) } })
    object = speedscope(fixture.merge(mode: :object, interval: 10))
    assert_equal %w[none none], object["profiles"].map { |p| p["unit"] }
    assert_equal SAMPLES.size * 10, object["profiles"].sum { |p| p["weights"].sum }
  end

  # ---- all exports ------------------------------------------------------------

  def test_exports_need_raw_samples
    result = fixture.reject { |k, _| k.to_s.start_with?("raw") }
    %i[print_pprof print_firefox print_speedscope].each do |method|
      error = assert_raises(Strobe::ProfileError) { Strobe::Report.new(result).public_send(method, StringIO.new) }
      assert_match(/needs raw samples: profile with raw: true/, error.message)
    end
  end

  # A profile with raw: true but no samples has no raw arrays (as with
  # stackprof): each export is then a valid, empty file.
  def test_exports_of_a_profile_without_samples
    result = Strobe.run(mode: :custom, raw: true) { nil }
    assert_equal 0, result[:samples]
    assert_empty pprof(result)[:samples]
    doc = firefox(result)
    assert_firefox_invariants(doc)
    assert_equal 0, doc["threads"].sum { |t| t["samples"]["length"] }
    profiles = speedscope(result)["profiles"]
    assert_equal 1, profiles.size
    assert_empty profiles[0]["samples"]
    outcome, = speedscope_import(JSON.generate(speedscope(result)))
    assert_equal :loaded, outcome
  end

  def test_corrupt_raw_data_raises_profile_error
    [
      ->(r) { r[:raw] = r[:raw].dup.tap { |a| a[1] = 99 } },             # unknown frame
      ->(r) { r[:raw] = r[:raw][0..-2] },                                  # truncated
      ->(r) { r[:raw_sample_threads] = r[:raw_sample_threads].dup.tap { |a| a[0] = 123 } }, # unknown thread
      ->(r) { r[:raw_sample_timestamps] = r[:raw_sample_timestamps][1..] }, # too few times
      ->(r) { r[:raw_sample_states] = r[:raw_sample_states].dup.tap { |a| a[0] = :dancing } },
      ->(r) { r[:raw] = r[:raw].dup.tap { |a| a[0] = 2**40 } },
    ].each_with_index do |corrupt, i|
      result = fixture
      corrupt.call(result)
      %i[print_pprof print_firefox print_speedscope].each do |method|
        assert_raises(Strobe::ProfileError, "case #{i} #{method}") { Strobe::Report.new(result).public_send(method, StringIO.new) }
      end
    end
  end

  # Exports stream: a sink gets the output in chunks of about a megabyte,
  # never the whole of a large export at once.
  def test_exports_stream_to_a_sink_in_chunks
    result = fixture
    runs = 60_000
    result[:raw] = result[:raw] * runs
    result[:raw_lines] = result[:raw_lines] * runs
    %i[raw_sample_threads raw_sample_states].each { |k| result[k] = result[k] * runs }
    span = SAMPLES.last[2]
    result[:raw_sample_timestamps] = (0...runs).flat_map { |r| SAMPLES.map { |s| s[2] + r * span } }
    result[:raw_timestamp_deltas] = [500] + result[:raw_sample_timestamps].each_cons(2).map { |a, b| b - a }
    result[:samples] = SAMPLES.size * runs
    %i[export_firefox export_speedscope export_pprof].each do |export|
      sink = Struct.new(:chunks) { def write(s) = chunks << s.bytesize }.new([])
      whole = Strobe::Native.public_send(export, result, nil, nil)
      assert_same sink, Strobe::Native.public_send(export, result, nil, sink)
      assert_operator sink.chunks.size, :>, 1, export unless export == :export_pprof # one sample per distinct stack: small
      assert_equal whole.bytesize, sink.chunks.sum, export
      assert_operator sink.chunks.max, :<=, 1 << 21, export
    end
  end

  # The exporters keep Ruby objects (names made from Symbols, the string
  # tables, the sink's chunks) while they allocate: a GC at every
  # allocation, with compaction on, must change nothing.
  def test_exports_survive_gc_at_every_allocation
    result = fixture
    result[:frames] = result[:frames].merge(4 => FRAMES[4].merge(name: :times_symbol, total_samples: 0, samples: 0))
    exports = %i[export_pprof export_firefox export_speedscope]
    expected = exports.map { |e| Strobe::Native.public_send(e, result, nil, nil).b }
    actual = under_gc_stress { exports.map { |e| Strobe::Native.public_send(e, result, nil, StringIO.new).string.b } }
    assert_equal expected, actual
    assert_includes expected[1], "times_symbol"
  end

  # A snapshot is built from a copy of the profile while it goes on; with a
  # GC at every allocation it is still the profile so far.
  def test_snapshot_under_gc_stress
    Strobe.start(mode: :custom, raw: true)
    threads = Array.new(3) { |i| Thread.new { (i + 1).times { Strobe.sample } } }
    threads.each(&:join)
    snap = under_gc_stress { Strobe.snapshot }
    Strobe.sample
    Strobe.stop
    final = Strobe.results
    assert_equal 6, snap[:samples]
    assert_equal 6, snap[:raw_sample_threads].size
    assert_equal 7, final[:samples]
    assert_equal snap[:raw][0, 4], final[:raw][0, 4]
    assert_equal [1, 2, 3], snap[:threads].values.map { |t| t[:samples] }.sort
    assert_equal 7, final[:threads].values.sum { |t| t[:samples] }
  ensure
    Strobe.stop
    Strobe.results
  end

  # Found in review, each a crash or corrupt output before its fix.
  def test_empty_stacks_and_blocked_empty_stacks
    result = { mode: :wall, interval: 1000, samples: 2, frames: {}, raw: [0, 2], raw_lines: [0, 2],
               raw_sample_states: %i[blocked waiting] }
    assert_firefox_invariants(firefox(result))
    assert_equal [[]], speedscope(result)["profiles"][0]["samples"]
    # one pprof sample per state, each with no location
    assert_equal [[], []], pprof(result)[:samples].map { |s| s[:locations] }
    # every frame dropped by a filter: an empty stack too
    assert_firefox_invariants(firefox(fixture, select_names: [/nothing matches/]))
  end

  def test_strings_stay_put_while_the_sink_compacts_the_heap
    meta = (1..50_000).to_h { |i| ["k#{i}", i] } # short comment strings, in the string table only
    result = { frames: {}, samples: 0, metadata: meta }
    sink = Class.new do
      attr_reader :out

      def initialize = @out = "".b

      def write(chunk)
        @out << chunk
        GC.verify_compaction_references(double_heap: true, toward: :empty)
        chunk.bytesize
      end
    end.new
    expected = Strobe::Native.export_pprof(result, nil, nil)
    Strobe::Native.export_pprof(result, nil, sink)
    assert_equal expected, sink.out
  end

  def test_hostile_numbers_are_profile_errors
    big = { mode: :wall, interval: 1000, samples: 1, frames: { 1 => FRAMES[1] }, raw: [1, 1, 1_000_000_000] }
    assert_raises(Strobe::ProfileError) { pprof(big) }.then { |e| assert_match(/more than the profile's samples/, e.message) }
    [{ interval: 2**62 - 1 }, { started_at: -1 }, { duration: 2**60 }, { interval: 1.5 }].each do |change|
      %i[print_pprof print_firefox print_speedscope].each do |method|
        assert_raises(Strobe::ProfileError, "#{change} #{method}") do
          Strobe::Report.new(fixture.merge(change)).public_send(method, StringIO.new)
        end
      end
    end
    stamps = fixture.merge(raw_sample_timestamps: [2**62] * SAMPLES.size)
    assert_raises(Strobe::ProfileError) { firefox(stamps) }
  end

  def test_pprof_strings_are_utf8_and_metadata_keys_may_hold_anything
    result = fixture
    result[:frames] = result[:frames].merge(3 => FRAMES[3].merge(name: "caf\xE9".b, file: "d\xE9j\xE0.rb".encode("UTF-8", "ISO-8859-1").encode("ISO-8859-1"),
                                                                total_samples: 0, samples: 0))
    result[:metadata] = { "nul\0key" => :v }
    assert(pprof(result)[:strings].all?(&:valid_encoding?))
    assert_includes pprof(result)[:strings], "déjà.rb"
    entries = firefox(result)["meta"]["extra"].find { |x| x["label"] == "Metadata" }["entries"]
    assert_equal [["nul\u0000key", "v"]], entries.map { |e| [e["label"], e["value"]] }
  end

  def test_samples_out_of_time_order_are_sorted_per_thread
    result = fixture(states: false)
    result[:raw_sample_timestamps] = result[:raw_sample_timestamps].reverse
    result.delete(:raw_timestamp_deltas)
    firefox(result)["threads"].each { |t| assert_equal t["samples"]["time"].sort, t["samples"]["time"] }
  end

  # Results are built from a copy of the profile, cleared before any Ruby
  # code runs: a second results call made while the first is building
  # (here: the first waits in a Thread#name) gets nil, not freed memory.
  def test_two_threads_taking_results_at_once
    napper = Thread.new { sleep }
    def napper.name
      sleep 0.05
      "slow"
    end
    Strobe.start(mode: :wall, interval: 200, raw: true)
    sleep 0.03
    Strobe.stop
    first = Thread.new { Strobe.results }
    sleep 0.01
    second = Strobe.results
    taken = [first.value, second].compact
    assert_equal 1, taken.size
    assert_operator taken[0][:samples], :>, 0
    assert_equal taken[0][:samples], taken[0][:raw_sample_threads].size
  ensure
    napper&.kill
  end

  def test_invalid_utf8_names_make_valid_json
    result = fixture
    result[:frames] = result[:frames].merge(3 => FRAMES[3].merge(name: "bad \xff name".b, total_samples: 0, samples: 0))
    [firefox(result), speedscope(result)].each do |doc|
      assert_includes JSON.generate(doc), "bad \u{fffd} name"
    end
  end

  # ---- writing them ------------------------------------------------------------

  def test_run_writes_each_format_with_raw_on_by_default
    Dir.mktmpdir do |dir|
      { pprof: "p.pb.gz", firefox: "f.json", speedscope: "s.json" }.each do |format, name|
        path = File.join(dir, name)
        # (Until a sample is taken, not for a set time: a loaded machine
        # may take none in 20 ms.)
        assert_equal path, Strobe.run(mode: :wall, out: path, format: format) {
          wait_until(30) { Strobe.snapshot[:samples].positive? }
        }
        bytes = File.binread(path)
        if format == :pprof
          prof = ProtobufReader.profile(gunzip(bytes))
          assert_operator prof[:samples].size, :>, 0
        else
          assert JSON.parse(bytes).is_a?(Hash)
        end
      end
    end
    error = assert_raises(ArgumentError) { Strobe.start(format: :firefox, raw: false) }
    assert_match(/format :firefox needs raw: true/, error.message)
    assert_raises(ArgumentError) { Strobe.start(format: :svg) }
  end

  def test_cli_report_exports
    Dir.mktmpdir do |dir|
      input = File.join(dir, "in.json")
      Strobe.save(fixture, input)
      %w[pprof firefox speedscope].each do |format|
        out = File.join(dir, "out.#{format}")
        _, err, status = run_ruby(<<~RUBY)
          require "strobe/cli"
          exit Strobe::CLI.new(["report", #{input.inspect}, "--#{format}", "-o", #{out.inspect}]).run
        RUBY
        assert status.success?, err
        assert_operator File.size(out), :>, 100
      end
      plain = File.join(dir, "plain.json")
      Strobe.save(fixture.reject { |k, _| k.to_s.start_with?("raw") }, plain)
      _, err, status = run_ruby(<<~RUBY)
        require "strobe/cli"
        exit Strobe::CLI.new(["report", #{plain.inspect}, "--speedscope"]).run
      RUBY
      assert_equal 1, status.exitstatus
      assert_equal 1, err.lines.size
      assert_match(/needs raw samples/, err)
    end
  end
end
