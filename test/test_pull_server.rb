# frozen_string_literal: true

require_relative "test_helper"
require "strobe/continuous/pull"
require "net/http"
require "socket"
require "stringio"
require "zlib"

# The pull endpoint scrapers (Grafana Alloy's pyroscope.scrape, Parca) ask
# for pprof profiles, as Go's net/http/pprof answers them: the HTTP layer,
# over real sockets on 127.0.0.1, with a fake profiler standing in for the
# continuous one.
#
# Every wait here is bounded (a safeguard against a hang); no assertion is
# about how long something took.
class TestPullServer < Minitest::Test
  PullServer = Strobe::Continuous::PullServer
  PPROF = Zlib.gzip("\x0a\x04fake pprof \xff\x00".b)
  CURL = `command -v curl 2>/dev/null`.strip.then { |path| path unless path.empty? }

  # A stand-in for the continuous profiler: profile(seconds:) sleeps that
  # long (unless sleep: false) and returns body, or raises busy (an
  # exception); allocs(seconds:) returns allocs, or raises Unavailable.
  # With meet: n, each profile call waits (at most 30 s) for n of them to
  # be under way at once; with gate: a Queue, each takes one thing from it
  # first (at most 60 s). Every call is recorded, and its ending counted.
  class FakeProfiler
    def initialize(sleep: true, body: PPROF, busy: nil, allocs: nil, meet: nil, gate: nil)
      @gate = gate
      @sleep = sleep
      @body = body
      @busy = busy
      @allocs = allocs
      @meet = meet
      @lock = Mutex.new
      @met = ConditionVariable.new
      @calls = []
      @under_way = 0
      @ended = 0
    end

    def profile(seconds:)
      record(:profile, seconds)
      raise @busy if @busy

      meet if @meet
      Timeout.timeout(60) { @gate.pop } if @gate
      sleep seconds if @sleep
      @body
    ensure
      @lock.synchronize { @ended += 1 }
    end

    def allocs(seconds:)
      record(:allocs, seconds)
      raise Strobe::Continuous::Unavailable, "allocations are not profiled (start with allocs: true)" unless @allocs

      @allocs
    end

    def calls
      @lock.synchronize { @calls.dup }
    end

    def ended
      @lock.synchronize { @ended }
    end

    # Whether every profile call saw @meet of them under way at once.
    def all_met?
      @lock.synchronize { @calls.count { |c| c[0] == :profile } == @all_met_count }
    end

    private

    def record(kind, seconds)
      @lock.synchronize { @calls << [kind, seconds] }
    end

    def meet
      @lock.synchronize do
        @under_way += 1
        @met.broadcast
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30
        while @under_way < @meet && (left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)).positive?
          @met.wait(@lock, left)
        end
        @all_met_count = @all_met_count.to_i + 1 if @under_way >= @meet
      end
    end
  end

  # A pull server on a free port of 127.0.0.1, started; yields it, its
  # profiler and its log (a StringIO).
  def with_pull(profiler = FakeProfiler.new, address: "127.0.0.1:0", **options)
    log = StringIO.new
    server = PullServer.new(address, profiler: profiler, err: log, **options).start
    yield server, profiler, log
  ensure
    server&.stop
  end

  # A request to the server at path; headers as given.
  def get(server, path, headers = {}, verb: Net::HTTP::Get, host: "127.0.0.1")
    Net::HTTP.start(host, server.port, open_timeout: 10, read_timeout: 60) do |http|
      http.request(verb.new(path, headers))
    end
  end

  def test_a_profile_is_the_profilers_pprof_bytes_as_they_are
    with_pull do |server, profiler, _|
      response = get(server, "/debug/pprof/profile?seconds=1")
      assert_equal "200", response.code
      assert_equal "application/octet-stream", response["content-type"]
      assert_equal 'attachment; filename="profile"', response["content-disposition"]
      assert_equal "nosniff", response["x-content-type-options"]
      assert_nil response["content-encoding"], "a pprof file is gzipped itself"
      assert_equal PPROF.bytesize.to_s, response["content-length"]
      assert_equal PPROF, response.body.b
      assert_equal [[:profile, 1]], profiler.calls
    end
  end

  # seconds: 30 when absent (as Go's), else a whole number from 1 to 60
  # (the documented maximum: no one holds the profiler longer); anything
  # else is 400 with the reason, and never reaches the profiler.
  def test_seconds
    with_pull(FakeProfiler.new(sleep: false)) do |server, profiler, _|
      { "" => 30, "?seconds=60" => 60, "?seconds=007" => 7, "?seconds=2&seconds=abc" => 2,
        "?debug=1&seconds=5" => 5 }.each do |query, seconds|
        response = get(server, "/debug/pprof/profile#{query}")
        assert_equal "200", response.code, query
        assert_equal [:profile, seconds], profiler.calls.last, query
      end
      assert_includes get(server, "/debug/pprof/").body, "1 to 60, default 30"
      calls = profiler.calls.size
      ["0", "-1", "61", "3600", "1.5", "abc", "", "1e3", "%ff", "+5", "5%20", "99999999999999999999"].each do |bad|
        response = get(server, "/debug/pprof/profile?seconds=#{bad}")
        assert_equal "400", response.code, bad
        assert_match(/\Abad seconds: .* \(a whole number from 1 to 60\)\n\z/, response.body, bad)
        assert_equal "400", get(server, "/debug/pprof/allocs?seconds=#{bad}").code, bad
      end
      assert_equal calls, profiler.calls.size, "bad seconds never reach the profiler"
    end
  end

  # Busy is a 500 with its message, as Go's "Could not enable CPU
  # profiling"; any other failure of the profiler a 500 and a line.
  def test_a_profiler_that_cannot_profile_now
    busy = Strobe::Continuous::Busy.new("a profile is already being taken")
    with_pull(FakeProfiler.new(busy: busy)) do |server, _, _|
      response = get(server, "/debug/pprof/profile?seconds=5")
      assert_equal ["500", "text/plain"], [response.code, response["content-type"]]
      assert_equal "a profile is already being taken\n", response.body
      assert_nil response["content-disposition"]
    end

    with_pull(FakeProfiler.new(busy: RuntimeError.new("boom"))) do |server, _, log|
      response = get(server, "/debug/pprof/profile?seconds=5")
      assert_equal "500", response.code
      assert_equal "no profile profile: RuntimeError\n", response.body
      assert_includes log.string, "strobe pull: no profile profile: RuntimeError: boom"
    end
  end

  def test_allocs
    with_pull do |server, profiler, _|
      response = get(server, "/debug/pprof/allocs")
      assert_equal "404", response.code
      assert_equal "allocations are not profiled (start with allocs: true)\n", response.body
      assert_equal [[:allocs, nil]], profiler.calls, "no seconds: none asked"
    end

    allocs = Zlib.gzip("allocs".b)
    with_pull(FakeProfiler.new(allocs: allocs)) do |server, profiler, _|
      response = get(server, "/debug/pprof/allocs?seconds=5")
      assert_equal ["200", "application/octet-stream"], [response.code, response["content-type"]]
      assert_equal 'attachment; filename="allocs"', response["content-disposition"]
      assert_equal allocs, response.body.b
      assert_equal [[:allocs, 5]], profiler.calls
    end

    profile_only = Object.new
    def profile_only.profile(seconds:) = PPROF
    with_pull(profile_only) do |server, _, _|
      assert_equal "404", get(server, "/debug/pprof/allocs").code
      assert_equal "200", get(server, "/debug/pprof/profile?seconds=1").code
    end
  end

  def test_index_other_paths_and_verbs
    with_pull do |server, profiler, _|
      ["/debug/pprof/", "/debug/pprof"].each do |path|
        index = get(server, path)
        assert_equal ["200", "text/plain"], [index.code, index["content-type"]], path
        assert_includes index.body, "/debug/pprof/profile?seconds=N"
        assert_includes index.body, "/debug/pprof/allocs"
      end
      ["/", "/debug/pprof/heap", "/debug/pprof/goroutine", "/debug/pprof/profilex", "/debug/pprof/profile/",
       "/x/debug/pprof/profile"].each do |path|
        assert_equal "404", get(server, path).code, path
      end
      [Net::HTTP::Post, Net::HTTP::Put, Net::HTTP::Delete, Net::HTTP::Options, Net::HTTP::Head].each do |verb|
        response = get(server, "/debug/pprof/profile?seconds=1", verb: verb)
        assert_equal "405", response.code, verb.name
        assert_equal "GET", response["allow"], verb.name
      end
      assert_empty profiler.calls

      raw = TCPSocket.open("127.0.0.1", server.port) do |socket|
        socket.write("NOT HTTP\r\n\r\n")
        Timeout.timeout(60) { socket.read }
      end
      assert_match %r{\AHTTP/1\.1 400 }, raw
    end
  end

  # With a token, every request carries it: Bearer, or basic auth with the
  # token as the password; anything else is 401, whatever the path.
  def test_token
    token = "s3cr3t-T0ken_with.~chars"
    with_pull(FakeProfiler.new(sleep: false), token: token) do |server, profiler, _|
      path = "/debug/pprof/profile?seconds=1"
      basic = ->(user, password) { "Basic #{["#{user}:#{password}"].pack('m0')}" }
      [nil, "Bearer", "Bearer ", "Bearer wrong", "Bearer #{token[0..-2]}", "Bearer #{token}x", "Token #{token}",
       "Basic", basic.call(token, ""), basic.call(token, "x"), "Basic !!!#{token}", token].each do |authorization|
        headers = authorization ? { "Authorization" => authorization } : {}
        response = get(server, path, headers)
        assert_equal "401", response.code, authorization.inspect
        assert_equal "Bearer", response["www-authenticate"], authorization.inspect
        refute_equal PPROF, response.body.b
      end
      assert_equal "401", get(server, "/debug/pprof/nothing-here").code, "paths are not revealed"
      assert_equal "401", get(server, path, verb: Net::HTTP::Post).code
      assert_empty profiler.calls

      ["Bearer #{token}", "bearer #{token}", "Bearer  #{token} ", basic.call("scraper", token),
       basic.call("", token)].each do |authorization|
        response = get(server, path, { "Authorization" => authorization })
        assert_equal "200", response.code, authorization
        assert_equal PPROF, response.body.b
      end
      assert_equal 5, profiler.calls.size

      request = Net::HTTP::Get.new(path)
      request.basic_auth("alloy", token)
      response = Net::HTTP.start("127.0.0.1", server.port, open_timeout: 10, read_timeout: 60) do |http|
        http.request(request)
      end
      assert_equal "200", response.code
    end

    ["", "with space", "tab\there", "caf\u00e9", 5, :sym].each do |bad|
      error = assert_raises(ArgumentError, bad.inspect) do
        PullServer.new("127.0.0.1:0", profiler: FakeProfiler.new, token: bad)
      end
      assert_match(/token/, error.message)
      refute_includes error.message, "with space", "the token is not shown"
    end
  end

  # One address group sending requests slowly holds at most
  # MAX_PENDING_PER_PEER places: its next connection pushes out its
  # oldest (503), the others stay open.
  def test_one_slow_address_holds_few_places
    with_pull(token: "t0ken") do |server, _, _|
      # (accepted in the order they connect)
      slow = Array.new(PullServer::MAX_PENDING_PER_PEER + 1) do
        TCPSocket.new("127.0.0.1", server.port).tap { |s| s.write("GET /debug/pprof/ HTTP/1.1\r\n") }
      end
      answer = Timeout.timeout(60) { slow.first.read }
      assert_match(%r{\AHTTP/1\.1 503 .*too many connections}m, answer)
      slow.drop(1).each do |socket|
        assert_equal :wait_readable, socket.read_nonblock(1, exception: false), "closed or answered early"
      end
    ensure
      slow&.each(&:close)
    end
  end

  # Issue 30, item 10: slow connections without the token from 8 source
  # addresses (127.0.0.2 to .9 here; any IPv6 host has as many), 5 each,
  # more than MAX_PENDING in all, all still open: an authorized scrape is
  # served (they used to hold every place: 503). Once with loopback as
  # the one group it is, once with each address a group of its own, as
  # eight hosts or eight IPv6 /64s are.
  def test_slow_connections_from_many_addresses_keep_no_scrape_out
    [PullServer, EachAddressItsOwn].each do |server_class|
      log = StringIO.new
      server = server_class.new("127.0.0.1:0", profiler: FakeProfiler.new(sleep: false), token: "t0ken",
                                               err: log, request_timeout: 600).start
      slow = (2..9).flat_map do |host|
        Array.new(PullServer::MAX_PENDING_PER_PEER + 1) do
          TCPSocket.new("127.0.0.1", server.port, "127.0.0.#{host}", 0).tap { |s| s.write("GET /debug/pprof/ HTT") }
        end
      end
      assert_operator slow.size, :>, PullServer::MAX_PENDING
      response = get(server, "/debug/pprof/profile?seconds=1", { "Authorization" => "Bearer t0ken" })
      assert_equal "200", response.code, "#{server_class}: #{response.body}"
      assert_equal PPROF, response.body.b
      open = slow.count { |socket| socket.read_nonblock(1, exception: false) == :wait_readable }
      assert_operator open, :>, 0, "#{server_class}: the slow connections were still there"
    ensure
      slow&.each(&:close)
      server&.stop
    end
  end

  # A pull server whose every address is a group of its own.
  class EachAddressItsOwn < PullServer
    private

    def address_group(socket)
      socket.remote_address.ip_address
    end
  end

  # With a token, a request without it is answered 401 by the accepting
  # thread as soon as its head is in: while every handler is busy with a
  # profile, more of them than there are places in the queue are all
  # answered, and an authorized request still finds its place (it is
  # answered once a handler is free).
  def test_requests_without_the_token_take_no_handler
    gate = Queue.new
    with_pull(FakeProfiler.new(sleep: false, gate: gate), token: "t0ken") do |server, profiler, _|
      authorized = "GET /debug/pprof/profile?seconds=1 HTTP/1.1\r\nAuthorization: Bearer t0ken\r\n\r\n"
      busy = Array.new(PullServer::HANDLERS) { TCPSocket.new("127.0.0.1", server.port).tap { |s| s.write(authorized) } }
      wait_until(60) { profiler.calls.size == PullServer::HANDLERS }
      (PullServer::MAX_QUEUED + 4).times do
        answer = TCPSocket.open("127.0.0.1", server.port) do |socket|
          socket.write("GET /debug/pprof/profile?seconds=1 HTTP/1.1\r\nAuthorization: Bearer t0k3n\r\n\r\n")
          socket.wait_readable(60) && socket.read
        end
        assert_match(%r{\AHTTP/1\.1 401 }, answer.to_s)
        refute_includes answer, "t0k"
      end
      assert_equal 0, profiler.ended, "every handler was still busy"
      waiting = TCPSocket.new("127.0.0.1", server.port)
      waiting.write(authorized)
      (PullServer::HANDLERS + 1).times { gate << :go }
      answers = (busy + [waiting]).map { |socket| Timeout.timeout(60) { socket.read } }
      assert(answers.all? { |answer| answer.start_with?("HTTP/1.1 200 ") }, answers.map { |a| a[0, 40] }.inspect)
    ensure
      (busy.to_a + [waiting]).compact.each(&:close)
      gate.close
    end
  end

  # Issue 30, item 9: without a token, only a loopback address is served;
  # any other refuses to start (the port is not kept) with one line saying
  # how to give one, or how to serve without one on purpose.
  def test_an_address_others_reach_needs_a_token
    free = TCPServer.new("0.0.0.0", 0).then { |probe| probe.addr[1].tap { probe.close } }
    others = ["0.0.0.0:#{free}", ":#{free}"]
    outside = Socket.ip_address_list.find { |a| a.ipv4? && !a.ipv4_loopback? }
    others << "#{outside.ip_address}:#{free}" if outside
    others.each do |address|
      error = assert_raises(ArgumentError, address) { PullServer.new(address, profiler: FakeProfiler.new) }
      assert_equal 1, error.message.lines.size
      ["token:", "STROBE_PPROF_TOKEN", "insecure: true", "STROBE_PPROF_INSECURE=1"].each do |way|
        assert_includes error.message, way, address
      end
      TCPServer.new("0.0.0.0", free).close # nothing holds the port
    end
    others.each do |address|
      [{ token: "t0ken" }, { insecure: true }].each do |options|
        with_pull(address: address, **options) do |server, _, _|
          headers = options[:token] ? { "Authorization" => "Bearer t0ken" } : {}
          assert_equal "200", get(server, "/debug/pprof/", headers, host: reachable(server)).code,
                       [address, options].inspect
        end
      end
    end
    ["127.0.0.1:0", "127.0.0.2:0", "localhost:0"].each do |address|
      with_pull(address: address) { |server, _, _| assert_equal "200", get(server, "/debug/pprof/", host: server.host).code }
    end
    error = assert_raises(ArgumentError) { PullServer.new("127.0.0.1:0", profiler: FakeProfiler.new, insecure: "yes") }
    assert_match(/insecure: must be true or false/, error.message)
  end

  # An address the server is reached at from here.
  def reachable(server)
    case server.host
    when "0.0.0.0" then "127.0.0.1"
    when "::" then File.read("/proc/sys/net/ipv6/bindv6only").strip == "1" ? "::1" : "127.0.0.1"
    else server.host
    end
  end

  # Address groups: an IPv4 address, an IPv6 /64, loopback as one.
  def test_address_groups
    group = ->(address) { Strobe::HTTPServer::Incoming.group_of(Addrinfo.tcp(address, 80)) }
    assert_equal ["loopback"], ["127.0.0.1", "127.0.0.9", "127.255.0.1", "::1", "::ffff:127.0.0.2"].map(&group).uniq
    assert_equal "10.1.2.3", group.call("10.1.2.3")
    assert_equal "10.1.2.3", group.call("::ffff:10.1.2.3")
    assert_equal ["2001:db8:1:2::/64"], ["2001:db8:1:2::1", "2001:db8:1:2:ffff:1:2:3"].map(&group).uniq
    refute_equal group.call("2001:db8:1:2::1"), group.call("2001:db8:1:3::1")
  end

  def test_two_profiles_at_once
    with_pull(FakeProfiler.new(sleep: false, meet: 2)) do |server, profiler, _|
      responses = Array.new(2) { Thread.new { get(server, "/debug/pprof/profile?seconds=2") } }.map(&:value)
      assert_equal %w[200 200], responses.map(&:code)
      assert(responses.all? { |r| r.body.b == PPROF })
      assert profiler.all_met?, "the two were under way at once: #{profiler.calls.inspect}"
    end
  end

  # A profile takes its seconds to produce, longer than the time a client
  # has to take a response: that time counts from the first byte written.
  # (The body is larger than the socket buffers: writing it waits for the
  # client, which a deadline already past would not.)
  def test_a_profile_longer_than_the_response_timeout_is_sent
    big = Random.new(1).bytes(16 << 20)
    with_pull(FakeProfiler.new(body: big), response_timeout: 2) do |server, profiler, log|
      response = get(server, "/debug/pprof/profile?seconds=3")
      assert_equal "200", response.code, log.string
      assert_equal big.bytesize, response.body.bytesize, log.string
      assert_equal big, response.body.b
      assert_equal [[:profile, 3]], profiler.calls
      assert_equal "", log.string
    end
  end

  # The writer's deadline, given as within: seconds, starts at its first
  # write; given as a time, it is that time.
  def test_the_writers_deadline
    assert_raises(ArgumentError) { Strobe::HTTPServer::DeadlineWriter.new($stdout) }
    assert_raises(ArgumentError) { Strobe::HTTPServer::DeadlineWriter.new($stdout, 1, within: 1) }
    reader, writer = UNIXSocket.pair
    out = Strobe::HTTPServer::DeadlineWriter.new(writer, within: 0.5)
    sleep 0.6 # producing the response
    out.write("x")
    assert out.left&.positive?, "counted from the first write"
    error = Timeout.timeout(60) { assert_raises(Strobe::HTTPServer::Timeout) { out.write("x" * (16 << 20)) } }
    assert_match(/did not take its response/, error.message)
  ensure
    reader&.close
    writer&.close
  end

  # A scraper that gives up while its profile is taken: the profile ends,
  # its response goes nowhere, and the server goes on answering.
  def test_a_client_that_goes_away_mid_profile
    with_pull do |server, profiler, _|
      2.times do |i|
        socket = TCPSocket.new("127.0.0.1", server.port)
        socket.write("GET /debug/pprof/profile?seconds=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_until(60) { profiler.calls.size == i + 1 }
        socket.close
      end
      wait_until(60) { profiler.ended == 2 }
      response = get(server, "/debug/pprof/profile?seconds=1")
      assert_equal "200", response.code
      assert_equal PPROF, response.body.b
      assert server.serving?
    end
  end

  # curl as a scraper: plain, then with the token as a bearer or a password.
  def test_curl
    skip "curl is not installed" unless CURL
    Dir.mktmpdir do |dir|
      file = File.join(dir, "profile.pb.gz")
      curl = lambda do |server, *args|
        out, err, status = run_tool(CURL, "-s", "-o", file, "-w", "%{http_code} %{content_type}", *args,
                                    "http://127.0.0.1:#{server.port}/debug/pprof/profile?seconds=1", timeout: 60)
        assert status.success?, err
        out
      end
      with_pull do |server, _, _|
        assert_equal "200 application/octet-stream", curl.call(server)
        assert_equal PPROF, File.binread(file)
        assert_equal "fake pprof \xff\x00".b, Zlib.gunzip(File.binread(file))[2..]
      end
      with_pull(token: "tok3n") do |server, _, _|
        assert_equal "401 text/plain", curl.call(server)
        assert_equal "200 application/octet-stream", curl.call(server, "-H", "Authorization: Bearer tok3n")
        assert_equal "200 application/octet-stream", curl.call(server, "-u", "scraper:tok3n")
        assert_equal PPROF, File.binread(file)
      end
    end
  end

  def test_addresses
    assert_equal ["127.0.0.1", 6060], PullServer.parse_address("127.0.0.1:6060")
    assert_equal ["0.0.0.0", 0], PullServer.parse_address("0.0.0.0:0")
    assert_equal ["::1", 6060], PullServer.parse_address("[::1]:6060")
    assert_equal ["", 6060], PullServer.parse_address(":6060")
    assert_equal ["localhost", 65_535], PullServer.parse_address("localhost:65535")
    ["6060", "127.0.0.1", "127.0.0.1:", "127.0.0.1:http", "::1:6060", "[::1]", "[::1]6060", "", ":", "[]:6060",
     "http://127.0.0.1:6060", " 127.0.0.1:6060", "127.0.0.1:6060 ", "127.0.0.1:-1", nil, 6060].each do |bad|
      error = assert_raises(ArgumentError, bad.inspect) { PullServer.new(bad, profiler: FakeProfiler.new) }
      assert_match(/pull address must be HOST:PORT .*got #{Regexp.escape(bad.inspect)}/, error.message)
    end
    error = assert_raises(ArgumentError) { PullServer.new("127.0.0.1:70000", profiler: FakeProfiler.new) }
    assert_match(/70000 must be from 0 to 65535/, error.message)
    error = assert_raises(ArgumentError) { PullServer.new("127.0.0.1:0", profiler: Object.new) }
    assert_match(/profile\(seconds:\)/, error.message)
    assert_raises(ArgumentError) { PullServer.new("127.0.0.1:0", profiler: FakeProfiler.new, response_timeout: 0) }

    with_pull do |server, _, _|
      assert_equal "127.0.0.1", server.host
      assert_operator server.port, :>, 0
      assert_equal "http://127.0.0.1:#{server.port}/debug/pprof/", server.url
      taken = assert_raises(SystemCallError) { PullServer.new("127.0.0.1:#{server.port}", profiler: FakeProfiler.new) }
      assert_kind_of Errno::EADDRINUSE, taken
    end

    # every interface: reachable on loopback too
    with_pull(address: ":0", insecure: true) do |server, _, _|
      assert_includes ["::", "0.0.0.0"], server.host
      assert_equal "200", get(server, "/debug/pprof/", host: reachable(server)).code
    end
    with_pull(address: "0.0.0.0:0", insecure: true) do |server, _, _|
      assert_equal "0.0.0.0", server.host
      assert_equal "200", get(server, "/debug/pprof/").code
    end

    begin
      with_pull(address: "[::1]:0") do |server, _, _|
        assert_equal "::1", server.host
        assert_equal "http://[::1]:#{server.port}/debug/pprof/", server.url
        assert_equal "200", get(server, "/debug/pprof/", host: "::1").code
      end
    rescue Errno::EADDRNOTAVAIL, Errno::EAFNOSUPPORT, SocketError => e
      skip "no IPv6 loopback here: #{e.message}"
    end
  end

  # Its threads are never sampled, and are started again when the program
  # kills them; a stopped server stays stopped.
  def test_threads_are_not_profiled_and_come_back
    with_pull do |server, _, _|
      names = Thread.list.map(&:name)
      assert_equal ["strobe pull", "strobe pull 1", "strobe pull 2", "strobe pull 3", "strobe pull 4"],
                   names.grep(/\Astrobe pull/).sort
      assert Strobe.start(mode: :wall, raw: true), "the profiler was running already"
      begin
        witness = Thread.new { sleep 0.2 }
        witness.name = "witness"
        assert_equal "200", get(server, "/debug/pprof/profile?seconds=1").code # a handler sleeps in it
        witness.join
      ensure
        Strobe.stop
        result = Strobe.results
      end
      threads = result[:threads].values.map { |t| t[:name].to_s }
      assert_includes threads, "witness"
      refute(threads.any? { |name| name.start_with?("strobe pull") }, threads.inspect)

      Thread.list.select { |t| t.name.to_s.match?(/\Astrobe pull \d/) }.each(&:kill).each(&:join)
      assert_equal "200", get(server, "/debug/pprof/").code, "the accept thread starts handlers again"
      Thread.list.select { |t| t.name.to_s.start_with?("strobe pull") }.each(&:kill).each(&:join)
      refute server.serving?
      assert server.revive
      assert server.serving?
      assert_equal "200", get(server, "/debug/pprof/").code
      server.stop
      refute server.revive, "a stopped server stays stopped"
      assert_raises(Errno::ECONNREFUSED) { TCPSocket.new("127.0.0.1", server.port).close }
    end
  end

  # A forked child closes its copy of the listening socket as it starts:
  # once the server stops, the port is free while the child lives on.
  def test_forked_children_do_not_hold_the_port
    with_pull do |server, _, _|
      listening = server.instance_variable_get(:@server)
      assert_includes PullServer.listening, listening
      report, report_w = IO.pipe
      hold, hold_w = IO.pipe
      pid = fork do
        report.close
        hold_w.close
        report_w.write(listening.closed? ? "closed" : "open")
        report_w.close
        hold.read # until the parent is done
        exit!(0)
      end
      [report_w, hold].each(&:close)
      begin
        assert_equal "closed", Timeout.timeout(60) { report.read }
        server.stop
        refute_includes PullServer.listening, listening
        TCPServer.new("127.0.0.1", server.port).close # binds: nobody holds it
      ensure
        hold_w.close
        Timeout.timeout(60) { Process.wait(pid) }
        report.close
      end
    end
  end
end
