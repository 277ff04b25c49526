# frozen_string_literal: true

require_relative "test_helper"
require "tmpdir"
require "json"
require "set"
require "rack"
require "rack/mock"
require "strobe/middleware"
require "strobe/continuous/endpoints"
require "strobe/cli"
require_relative "firefox_checks"

# The marker timeline beside the samples (issue 19): GC pauses, the Rack
# request, Strobe.mark; kept in result[:markers], in profile files and
# merges.
class TestMarkers < Minitest::Test
  include FirefoxChecks

  def main_id(result)
    result[:threads].find { |_, t| t[:main] }&.first
  end

  def test_strobe_mark_records_the_block_on_its_thread
    value = nil
    result = Strobe.run(mode: :wall, interval: 1000, raw: true) do
      spin(0.005)
      value = Strobe.mark("load", rows: 3, table: :posts, klass: Object, ratio: 0.5) { spin(0.02); :loaded }
      Strobe.mark(:tick)
    end
    assert_equal :loaded, value, "mark returns what its block returns"
    load, tick = result[:markers].select { |m| m[:type] == :user }
    assert_equal ["load", "tick"], [load[:name], tick[:name]]
    assert_equal main_id(result), load[:thread]
    assert_equal({ rows: 3, table: "posts", klass: "Object", ratio: 0.5 }, load[:data])
    assert_operator load[:end] - load[:start], :>=, 20_000, "the block's span, in microseconds"
    assert_nil tick[:end], "a mark without a block is an instant"
    assert_nil tick[:data]
    assert_operator tick[:start], :>=, load[:end]
    # The clock of sample times.
    stamps = result[:raw_sample_timestamps]
    assert_operator load[:start], :>, stamps.first - 20_000
    assert_operator load[:end], :<, stamps.last + 20_000
    assert_equal result[:markers].sort_by { |m| m[:start] }, result[:markers], "in order of start"
  end

  def test_marks_where_nothing_is_sampled_only_run_the_block
    assert_equal 7, Strobe.mark("idle") { 7 }
    assert_nil Strobe.mark("idle")
    ready = Queue.new
    other = Thread.new { ready << Thread.current.native_thread_id; sleep 0.2 }
    other_id = ready.pop
    result = Strobe.run(mode: :wall, interval: 1000, threads: [other]) { Strobe.mark("main, not profiled") { spin(0.01) } }
    other.join
    # (The profiled thread may have waited for the GVL meanwhile: a marker
    # of its own.)
    assert_equal [], (result[:markers] || []).reject { |m| m[:thread] == other_id && m[:type] == :gvl },
                 "no marker for a thread that is not profiled"
  end

  def test_gc_pauses_are_markers_with_phases_and_reason
    result = Strobe.run(mode: :wall, interval: 1000, raw: true) do
      spin(0.002)
      GC.start
      spin(0.002)
    end
    # GC.start: gc_by "method"; a major GC, whose major_by is "force" or a
    # reason Ruby had pending ("oldmalloc" seen on 3.4).
    started = result[:markers].select { |m| m[:type] == :gc && m[:data][:gc_by] == "method" }
    refute_empty started, result[:markers].inspect
    gc = started.first
    assert_equal "GC", gc[:name]
    assert_equal main_id(result), gc[:thread]
    assert_kind_of String, gc[:data][:major_by]
    assert_equal %w[marking sweeping], gc[:data][:phases], "GC.start marks and sweeps at once"
    assert_operator gc[:end], :>=, gc[:start]
  end

  # Uses this much of the calling thread's CPU time in Ruby code (seconds).
  def burn(seconds)
    clock = Process::CLOCK_THREAD_CPUTIME_ID
    deadline = Process.clock_gettime(clock) + seconds
    nil while Process.clock_gettime(clock) < deadline
  end

  # Ruby 3.2+ (GVL events): a thread's stretches of waiting for the GVL and
  # of being blocked without it, 100 µs or more, are markers on its
  # timeline; one under way as profiling stops ends there. Two threads
  # burning CPU take turns with the GVL (Ruby's 100 ms time slice), so each
  # waits; a sleeping one is blocked for its sleep.
  def test_gvl_waits_and_blocks_are_markers
    ids = Queue.new
    result = Strobe.run(mode: :wall, interval: 1000, raw: true) do
      Thread.new { ids << [:sleeper, Thread.current.native_thread_id]; sleep 0.05 }.join
      2.times.map { |i| Thread.new { ids << [i, Thread.current.native_thread_id]; burn(0.25) } }.each(&:join)
      Thread.new { ids << [:late, Thread.current.native_thread_id]; sleep 0.2 }
      sleep 0.05
    end
    ids = Array.new(ids.size) { ids.pop }.to_h
    gvl = result[:markers].select { |m| m[:type] == :gvl }
    unless Strobe::Native::GVL_STATES
      assert_empty gvl, "no GVL events on Ruby #{RUBY_VERSION}: no such markers"
      return
    end
    gvl.each do |m|
      assert_includes [["GVL wait", { state: "waiting" }], ["Blocked", { state: "blocked" }]], [m[:name], m[:data]]
      assert_operator m[:end] - m[:start], :>=, 100
    end
    blocked = ->(id) { gvl.select { |m| m[:thread] == id && m[:name] == "Blocked" } }
    assert_operator blocked.(ids[:sleeper]).map { |m| m[:end] - m[:start] }.max.to_i, :>=, 45_000, "its sleep"
    [0, 1].each { |i| refute_empty gvl.select { |m| m[:thread] == ids[i] && m[:name] == "GVL wait" }, "burner #{i}" }
    late = blocked.(ids[:late]).max_by { |m| m[:end] }
    refute_nil late, "a stretch under way at the stop ends there"
    assert_operator late[:end] - late[:start], :>=, 40_000, "blocked from its start to the stop"

    io = StringIO.new
    Strobe::Report.new(result).print_firefox(io)
    doc = JSON.parse(io.string)
    assert_firefox_invariants(doc)
    categories = doc["meta"]["categories"].map { |c| c["name"] }
    track = doc["threads"].find { |t| t["tid"] == ids[0] }
    waits = track["markers"]["name"].each_index.select { |k| track["stringArray"][track["markers"]["name"][k]] == "GVL wait" }
    refute_empty waits
    waits.each { |k| assert_equal "GVL wait", categories[track["markers"]["category"][k]] }
  end

  # A thread started while profiled has its start and end on its timeline.
  def test_threads_start_and_end_as_markers
    id = nil
    result = Strobe.run(mode: :wall, interval: 1000) { Thread.new { id = Thread.current.native_thread_id; spin(0.005) }.join }
    mine = result[:markers].select { |m| m[:type] == :thread && m[:thread] == id }
    assert_equal ["Thread start", "Thread end"], mine.map { |m| m[:name] }
    assert(mine.all? { |m| m[:end].nil? && m[:data].nil? }, "instants")
    assert_operator mine[0][:start], :<=, mine[1][:start]
  end

  # In the Firefox Profiler export, each thread's own markers are on its
  # track, at the times of its samples.
  def test_markers_in_the_firefox_export
    worker = nil
    result = Strobe.run(mode: :wall, interval: 1000, raw: true) do
      Strobe.mark("outer", step: 1) { spin(0.05) }
      Thread.new do
        worker = Thread.current.native_thread_id
        Strobe.mark("inner") { spin(0.01) }
      end.join
      GC.start
    end
    io = StringIO.new
    Strobe::Report.new(result).print_firefox(io)
    doc = JSON.parse(io.string)
    assert_firefox_invariants(doc)
    names = doc["threads"].to_h do |t|
      [t["tid"], t["markers"]["name"].map { |i| t["stringArray"][i] }]
    end
    assert_equal ["outer"], names.fetch(main_id(result)) & %w[outer inner]
    assert_equal ["inner"], names.fetch(worker) & %w[outer inner]
    assert_includes names.fetch(main_id(result)), "GCMajor", "GC.start's pause"
    main = doc["threads"].find { |t| t["tid"] == main_id(result) }
    outer = main["markers"]["name"].index { |i| main["stringArray"][i] == "outer" }
    times = main["samples"]["time"]
    start, finish = main["markers"]["startTime"][outer], main["markers"]["endTime"][outer]
    assert_operator finish - start, :>=, 50.0
    # (About 50; a loaded machine misses some.)
    assert_operator times.count { |t| t.between?(start, finish) }, :>=, 3, "its samples fall in its span"
  end

  def endpoint_work_a(seconds) = spin(seconds)
  def endpoint_work_b(seconds) = spin(seconds)

  # strobe report --endpoint NAME: the samples the threads serving requests
  # to NAME took while they did, from the middleware's request markers.
  def test_a_report_restricted_to_one_endpoint
    results = Queue.new
    inner = lambda do |env|
      env["PATH_INFO"] == "/a" ? endpoint_work_a(0.03) : endpoint_work_b(0.03)
      [200, {}, ["ok"]]
    end
    # (The application names its endpoints: a path is none by default.)
    mw = Strobe::Middleware.new(inner, enabled: true, mode: :wall, interval: 1000, raw: true, save_every: false,
                                       save_interval: false, save_at_exit: false, on_result: ->(r) { results << r },
                                       endpoint: ->(env) { "GET #{env['PATH_INFO']}" })
    %w[/a /b /a].map { |path| Thread.new { mw.call(Rack::MockRequest.env_for(path)) } }.each(&:join)
    mw.save
    result = Timeout.timeout(10) { results.pop }
    Dir.mktmpdir do |dir|
      path = File.join(dir, "p.json")
      Strobe.save(result, path)
      out = StringIO.new
      err = StringIO.new
      assert_equal 0, Strobe::CLI.new(["report", path, "--endpoint", "GET /a", "--limit", "50"], out: out, err: err).run,
                   err.string
      assert_includes out.string, "TestMarkers#endpoint_work_a"
      refute_includes out.string, "endpoint_work_b"
      err = StringIO.new
      assert_equal 1, Strobe::CLI.new(["report", path, "--endpoint", "GET /c"], out: StringIO.new, err: err).run
      assert_match(/no request to endpoint "GET \/c" in this profile \(endpoints: GET \/a, GET \/b\)/, err.string)
    end
    a = Strobe::Report.new(result, endpoint: "GET /a").result
    assert_equal 2, a[:threads].size, "the two threads that served /a"
    assert_equal(["GET /a", "GET /a"], a[:markers].select { |m| m[:type] == :request }.map { |m| m[:name] })
    # (No count of samples is expected: a loaded machine misses ticks.)
    b = Strobe::Report.new(result, endpoint: "GET /b").result
    assert_operator a[:samples], :>, 0
    assert_operator b[:samples], :>, 0
    assert_operator a[:samples] + b[:samples], :<=, result[:samples], "no sample counted for both endpoints"
  end

  # Native.windows_subset: samples of each window's thread in its window,
  # overlapping and unbounded windows included, markers that overlap one.
  def test_windows_subset_keeps_each_threads_windows
    stamps = (1..10).map { |k| k * 100 }
    result = {
      version: 1.2, mode: :wall, interval: 100, samples: 10, gc_samples: 0, missed_samples: 0,
      frames: { 1 => { name: "a", file: "a.rb", line: 1 }, 2 => { name: "b", file: "b.rb", line: 2 } },
      threads: { 7 => { name: "x" }, 8 => { name: "y" } },
      raw: [1, 1, 5, 1, 2, 5], raw_lines: [1, 1, 5, 1, 2, 5], raw_sample_threads: [7, 8] * 5,
      raw_sample_timestamps: stamps, raw_timestamp_deltas: [100] + [100] * 9,
      markers: [{ type: :user, name: "in", thread: 7, start: 250, end: 260, data: nil },
                { type: :user, name: "out", thread: 7, start: 900, end: nil, data: nil },
                { type: :user, name: "other", thread: 9, start: 100, end: 200, data: nil }],
    }
    # thread 7's samples at 100, 300, 500, 700, 900; thread 8's at 200, 400, ...
    sub = Strobe::Native.windows_subset(result, [[7, 250, 550], [7, 500, 600], [8, nil, 400], [9, 0, 1000], [7, 5, 1]])
    assert_equal [7, 7, 8, 8], sub[:raw_sample_threads].sort
    assert_equal [200, 300, 400, 500], sub[:raw_sample_timestamps].sort
    assert_equal [7, 8, 9], sub[:threads].keys
    assert_nil sub[:thread], "several threads"
    assert_equal %w[in other], sub[:markers].map { |m| m[:name] }, "not one outside its thread's windows"
    assert_equal 4, sub[:samples]
    assert_equal 7, Strobe::Native.windows_subset(result, [[7, nil, nil]])[:thread]
    assert_raises(ArgumentError) { Strobe::Native.windows_subset(result, [[7, 1]]) }
    assert_raises(TypeError) { Strobe::Native.windows_subset(result, [[7, "a", 2]]) }
  end

  def test_markers_survive_a_profile_file_and_a_merge
    result = Strobe.run(mode: :wall, interval: 1000, raw: true) do
      Strobe.mark("a", n: 1, ok: true, none: nil) { spin(0.003) }
      GC.start
    end
    Dir.mktmpdir do |dir|
      path = File.join(dir, "p.json.gz")
      Strobe.save(result, path)
      loaded = Strobe.load(path)
      assert_equal result[:markers], loaded[:markers]
      merged = Strobe::Merge.results([loaded, loaded])
      assert_equal loaded[:markers] * 2, merged[:markers]
    end
  end

  def test_malformed_markers_are_profile_errors
    result = Strobe.run(mode: :wall, interval: 1000, raw: true) { Strobe.mark("a") { spin(0.002) } }
    doc = JSON.parse(JSON.generate(Strobe::ProfileFile.encode(result)), symbolize_names: true)
    [
      "not rows", [["user", "a", 1, 10]], [["User!", "a", 1, 10, nil, nil]], [["user", 5, 1, 10, nil, nil]],
      [["user", "a", "t", 10, nil, nil]], [["user", "a", 1, -1, nil, nil]], [["user", "a", 1, 10, 9, nil]],
      [["user", "a", 1, 10, nil, [1]]], [["user", "a", 1, 10, nil, { k: { deep: 1 } }]]
    ].each do |bad|
      error = assert_raises(Strobe::ProfileError, bad.inspect) { Strobe::ProfileFile.decode(doc.merge(markers: bad), "p.json") }
      assert_match(/\Ap\.json: marker/, error.message)
    end
  end

  def test_marker_add_checks_its_arguments
    assert_raises(TypeError) { Strobe::Native.marker_add("user", "a", 1, nil, nil) }
    assert_raises(TypeError) { Strobe::Native.marker_add(:user, "a", 1, nil, [1]) }
    Strobe.run(mode: :wall, interval: 1000) do
      now = Strobe::Native.now_us
      assert_raises(ArgumentError) { Strobe::Native.marker_add(:user, "a", now, now - 1, nil) }
      assert_raises(ArgumentError) { Strobe::Native.marker_add(:user, "a", -5, nil, nil) }
    end
  end

  # Each profiled request is a marker on its thread: method, path, status
  # (nil when the application raised) and endpoint.
  def test_requests_are_markers
    results = Queue.new
    app = lambda do |env|
      raise "boom" if env["PATH_INFO"] == "/fail"

      spin(0.005)
      [201, {}, ["ok"]]
    end
    mw = Strobe::Middleware.new(app, enabled: true, raw: true, save_every: 3, save_at_exit: false,
                                     on_result: ->(r) { results << r })
    [["/posts/1", "GET"], ["/posts", "POST"]].each do |path, method|
      Thread.new { mw.call(Rack::MockRequest.env_for(path, method: method)) }.join
    end
    assert_raises(RuntimeError) { mw.call(Rack::MockRequest.env_for("/fail")) }
    result = Timeout.timeout(10) { results.pop }
    requests = result[:markers].select { |m| m[:type] == :request }
    assert_equal ["GET /posts/1", "POST /posts", "GET /fail"], requests.map { |m| m[:name] }
    assert_equal({ method: "GET", path: "/posts/1", status: 201, endpoint: "GET (unrouted)" }, requests[0][:data])
    assert_nil requests[2][:data][:status], "the application raised"
    requests.each { |m| assert_includes result[:threads].keys, m[:thread] }
    assert_operator requests[0][:end] - requests[0][:start], :>=, 5000
  end

  # An endpoint is the framework's route, never a path the client chose
  # (issue 30, item 8): those paths were pprof labels as they came.
  def test_endpoints_are_routes_never_paths
    controller = Class.new do
      def self.name = "PostsController"
      def action_name = "index"
    end
    env = Rack::MockRequest.env_for("/posts")
    env["action_controller.instance"] = controller.new
    assert_equal "PostsController#index", Strobe::Middleware.endpoint(env)
    known = Class.new(controller) do
      def self.name = "PostsController"
      def self.action_methods = Set["index"]
      attr_accessor :action_name
    end
    env["action_controller.instance"] = known.new.tap { |c| c.action_name = "jane.doe@example.com" }
    assert_equal "PostsController#(unknown action)", Strobe::Middleware.endpoint(env),
                 "a dynamic :action the controller does not have (third review)"
    env["action_controller.instance"] = known.new.tap { |c| c.action_name = "index" }
    assert_equal "PostsController#index", Strobe::Middleware.endpoint(env)
    routed = Rack::MockRequest.env_for("/posts/5").merge("action_dispatch.route_uri_pattern" => "/posts/:id(.:format)")
    assert_equal "GET /posts/:id(.:format)", Strobe::Middleware.endpoint(routed), "Rails 7.1+, a route to a Rack app"
    sinatra = Rack::MockRequest.env_for("/users/jane.doe").merge("sinatra.route" => "GET /users/:name")
    assert_equal "GET /users/:name", Strobe::Middleware.endpoint(sinatra)
    route = Struct.new(:request_method, :path).new("POST", "/api/users/:id(.:format)")
    grape = Rack::MockRequest.env_for("/api/users/7", method: "POST").merge("grape.routing_args" => { route_info: route })
    assert_equal "POST /api/users/:id(.:format)", Strobe::Middleware.endpoint(grape)
    grape["REQUEST_METHOD"] = "QwErTy"
    grape["grape.routing_args"] = { route_info: Struct.new(:path).new("/api/users/:id") }
    assert_equal "OTHER /api/users/:id", Strobe::Middleware.endpoint(grape), "a method is the client's too"

    assert_equal "GET (not found)", Strobe::Middleware.endpoint(Rack::MockRequest.env_for("/wp-admin/setup.php"), 404),
                 "a path nothing served is no endpoint of its own"
    assert_equal "GET /", Strobe::Middleware.endpoint(Rack::MockRequest.env_for("").merge("PATH_INFO" => ""))
    %w[/reset_password/QwErTyUiOpAsDfGhJkL /users/jane.doe/medical-records /posts/42 /posts?page=2 /a/].each do |path|
      assert_equal "GET (unrouted)", Strobe::Middleware.endpoint(Rack::MockRequest.env_for(path)), path
    end
    assert_equal "OTHER (unrouted)", Strobe::Middleware.endpoint(Rack::MockRequest.env_for("/x", method: "QwErTyUiOp")),
                 "a method is the client's too"

    naming = ->(env) { env["PATH_INFO"] == "/health" ? "health check #{'x' * 200}" : nil }
    assert_equal "health check #{'x' * 107}", Strobe::Middleware.endpoint(Rack::MockRequest.env_for("/health"), 200, naming),
                 "the application's own name, cut to ENDPOINT_LIMIT"
    assert_equal "GET (unrouted)", Strobe::Middleware.endpoint(Rack::MockRequest.env_for("/x"), 200, naming), "nil: the default"
    assert_raises(ArgumentError) { Strobe::Middleware.new(->(_) {}, endpoint: "GET /x") }
    assert_raises(ArgumentError) { Strobe::Continuous::Endpoints.new(->(_) {}, endpoint: 1) }
  end

  # However an application names them, a process has at most
  # max_endpoints distinct endpoints: the rest are one, "(other)".
  def test_endpoints_per_process_are_capped
    assert_ruby_prints(<<~OUT, <<~RUBY)
      200
      ["GET (unrouted)", "e1", "e2", "(other)", "(other)", "e1", "GET (unrouted)"]
      3
    OUT
      require "strobe/middleware"
      puts Strobe::Middleware.max_endpoints
      Strobe::Middleware.max_endpoints = 3
      names = ["x", "e1", "e2", "e3", "e4", "e1", "x"].map do |name|
        Strobe::Middleware.endpoint({ "REQUEST_METHOD" => "GET", "PATH_INFO" => "/p" }, 200, ->(_) { name == "x" ? nil : name })
      end
      p names
      begin
        Strobe::Middleware.max_endpoints = 0
      rescue ArgumentError
        puts Strobe::Middleware.max_endpoints
      end
    RUBY
  end

  def test_a_one_thread_result_keeps_that_threads_markers
    result = Strobe.run(mode: :wall, interval: 1000, raw: true) do
      Strobe.mark("main") { spin(0.01) }
      Thread.new { Strobe.mark("worker") { spin(0.01) } }.join
      Strobe.mark("main again") { spin(0.005) }
    end
    main = main_id(result)
    worker = result[:markers].find { |m| m[:name] == "worker" }
    # (GC pauses may be marked too: only the marks are compared.)
    marks = ->(subset) { subset[:markers].select { |m| m[:type] == :user }.map { |m| m[:name] } }
    assert_equal ["main", "main again"], marks.call(Strobe::Native.thread_subset(result, main))
    assert_equal ["worker"], marks.call(Strobe::Native.thread_subset(result, worker[:thread]))
    first = result[:markers].find { |m| m[:name] == "main" }
    window = Strobe::Native.thread_subset(result, main, first[:start], first[:end])
    assert_equal ["main"], marks.call(window), "only those overlapping the window"
    # Its timeline is the window's, not the whole profile's.
    assert_equal first[:end] - first[:start], window[:duration]
    assert_operator window[:started_at], :>, result[:started_at]
    assert_operator window[:started_at], :<, result[:started_at] + result[:duration]
  end

  # A JSON file holds UTF-8 only: a request path of other bytes (servers
  # pass them as they came) must not make the save fail.
  def test_names_and_data_are_made_utf8
    result = Strobe.run(mode: :wall, interval: 1000, raw: true) do
      Strobe.mark("caf\xC3\xA9 \xFF".b, path: "/\xFF".b, latin: String.new("d\xE9j\xE0", encoding: "ISO-8859-1"), big: 2**70) { spin(0.002) }
    end
    marker = result[:markers].find { |m| m[:type] == :user }
    assert_equal "café \uFFFD", marker[:name]
    assert_equal({ path: "/\uFFFD", latin: "déjà", big: (2**70).to_s }, marker[:data])
    Dir.mktmpdir do |dir|
      path = File.join(dir, "p.json")
      Strobe.save(result, path)
      assert_equal result[:markers], Strobe.load(path)[:markers]
    end
  end

  def test_a_profile_keeps_at_most_200_000_markers
    result = Strobe.run(mode: :custom) do
      Strobe.sample
      200_003.times { Strobe::Native.marker_add(:user, "m", 1, nil, nil) }
    end
    assert_equal 200_000, result[:markers].size
    assert_equal 3, result[:dropped_markers]
  end

  def test_stackprof_files_and_empty_markers_load
    Dir.mktmpdir do |dir|
      result = Strobe.run(mode: :wall, interval: 1000, raw: true) { spin(0.003) }
      result[:markers] = nil
      path = File.join(dir, "p.json")
      Strobe.save(result, path)
      refute Strobe.load(path).key?(:markers)
      foreign = File.join(dir, "stackprof.json")
      doc = { mode: "wall", interval: 1000, samples: 0, frames: {}, markers: "junk", dropped_markers: 2 }
      File.write(foreign, JSON.generate(doc))
      refute Strobe.load(foreign).key?(:markers), "stackprof's form has no markers: what is there is not read"
      File.write(foreign, JSON.generate(doc.merge(dropped_markers: -1)))
      assert_raises(Strobe::ProfileError) { Strobe.load(foreign) }
    end
  end

  # An exception raised into the request's thread as the middleware marks
  # the request (a request timeout) still leaves the scope and the profile.
  def test_a_request_cut_short_while_marked_still_ends_its_profile
    killer = Class.new(Exception)
    middleware = Class.new(Strobe::Middleware) do
      define_method(:mark_request) { |*| raise killer }
    end
    mw = middleware.new(->(_env) { [200, {}, ["ok"]] }, enabled: true, save_every: false, save_interval: false,
                                                          save_at_exit: false, on_result: ->(_) {}, idle_stop: false)
    assert_raises(killer) { mw.call(Rack::MockRequest.env_for("/")) }
    refute Strobe.running?, "the last request's end stops the profile"
    assert_equal [200, {}, ["ok"]], Strobe::Middleware.new(->(_env) { [200, {}, ["ok"]] }).call(Rack::MockRequest.env_for("/"))
  ensure
    Strobe.stop
    Strobe.results
  end
end
