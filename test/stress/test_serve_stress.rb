# frozen_string_literal: true

# `rake test:stress`: `strobe serve` on a program sampled at 10 kHz while
# idle connections, clients sending their request a byte at a time and
# clients GETting the profile in a loop all hit it, for STRESS_SERVE_SECONDS
# (8). Every GET must bring a whole profile that loads; once the program
# has ended, one TERM must end the serving with the program's status 0, and
# nothing may have crashed. Bounded in time throughout; nothing is timed.
require "test_helper"
require "firefox_checks"
require "net/http"
require "socket"
require "json"
require "zlib"
require "tmpdir"

class TestServeStress < Minitest::Test
  include FirefoxChecks

  STROBE = File.join(StrobeTestHelpers::ROOT, "exe", "strobe")
  SECONDS = Float(ENV.fetch("STRESS_SERVE_SECONDS", "8"))
  URL = %r{at (http://127\.0\.0\.1:\d+/[0-9a-f]{32}/profile\.json)}
  CRASH = /\[BUG\]|Segmentation fault|AddressSanitizer|runtime error:|Deadlock|terminated with exception/
  # STRESS_RUBY_ARGS="--zjit": the program runs under that JIT (as in
  # test_stress.rb).
  RUBY_ARGS = ENV.fetch("STRESS_RUBY_ARGS", "").split
  IDLE = 4
  SLOW = 3
  FAST = 2

  # Two threads computing until the file `stop` appears.
  APP = <<~RUBY
    def busy = 20_000.times.sum
    def level(n) = n.zero? ? busy : level(n - 1)
    worker = Thread.new { loop { level(20); sleep 0.001 } }
    worker.name = "worker"
    level(10) until File.exist?(ARGV[0])
  RUBY

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  def test_served_under_load_then_one_term_ends_it
    Dir.mktmpdir("strobe-stress") do |dir|
      app = File.join(dir, "app.rb")
      stop = File.join(dir, "stop")
      File.write(app, APP)
      Open3.popen3({}, RbConfig.ruby, "-I#{ENV['STROBE_LIB'] || LIB}", "-I#{LIB}", STROBE, "serve", "--port", "0",
                   "--interval", "100", "--", RbConfig.ruby, *RUBY_ARGS, app, stop, pgroup: true) do |stdin, stdout, stderr, wait|
        stdin.close
        err = +""
        reader = Thread.new { stderr.each_line { |line| err << line } }
        out = Thread.new { stdout.read }
        begin
          url = wait_for(60, -> { err }) { err[URL, 1] if err.include?("strobe: open ") }
          uri = URI(url)
          finish = now + SECONDS
          results = Queue.new
          clients = Array.new(IDLE) { Thread.new { idle(uri, finish) } } +
                    Array.new(SLOW) { Thread.new { slow(uri, finish) } } +
                    Array.new(FAST) { Thread.new { fast(uri, finish, results) } }
          clients.each { |t| assert t.join(SECONDS + 120), "a client did not finish" }
          checked = drain(results)
          refute_empty checked, "no GET completed"
          checked.each { |problem| assert_nil problem }

          File.write(stop, "")
          wait_for(120, -> { err }) { err.include?("its profile is still served") }
          last = get(uri)
          assert_equal "200", last.code
          doc = JSON.parse(gunzip(last.body))
          assert_firefox_invariants(doc)
          assert_includes doc["threads"].map { |t| t["name"] }, "worker"

          Process.kill(:TERM, wait.pid) # one
          status = wait_for(120, -> { err }) { wait.value unless wait.alive? }
          reader.join(60)
          context = "#{status.inspect}\nstdout: #{out.value[0, 500]}\nstderr: #{err[0, 3000]}"
          assert_equal 0, status.exitstatus, context
          refute_match CRASH, err, context
        ensure
          Process.kill(:KILL, -wait.pid) if wait.alive?
        end
      end
    end
  end

  # Polls until the block gives something (a safeguard against a hang).
  def wait_for(seconds, context)
    deadline = now + seconds
    loop do
      value = yield
      return value if value
      flunk "gave up after #{seconds} s; so far:\n#{context.call[0, 3000]}" if now > deadline

      sleep 0.05
    end
  end

  def get(uri)
    Net::HTTP.start(uri.host, uri.port, open_timeout: 30, read_timeout: 60) do |http|
      http.request(Net::HTTP::Get.new(uri, "Accept-Encoding" => "gzip"))
    end
  end

  # GETs until finish; each result is nil (a profile that loads) or what
  # was wrong.
  def fast(uri, finish, results)
    while now < finish
      response = get(uri)
      results << check(response)
    end
  rescue StandardError => e
    results << "#{e.class}: #{e.message}"
  end

  def check(response)
    return "status #{response.code}: #{response.body[0, 200]}" unless response.code == "200"

    doc = JSON.parse(gunzip(response.body))
    return "not a Firefox profile: #{doc.keys.inspect}" unless doc.dig("meta", "preprocessedProfileVersion")
    return "no thread in the profile" if doc["threads"].to_a.empty?

    nil
  end

  # Connects and sends nothing, again whenever the server drops it.
  def idle(uri, finish)
    while now < finish
      socket = TCPSocket.new(uri.host, uri.port)
      socket.wait_readable([finish - now, 0].max) # dropped at the request deadline, or the end
      socket.close
    end
  rescue SystemCallError
    nil
  end

  # Sends a request a byte at a time, again whenever the server drops it
  # (its request deadline) or answers.
  def slow(uri, finish)
    request = "GET #{uri.path} HTTP/1.1\r\nHost: #{uri.host}:#{uri.port}\r\n\r\n"
    while now < finish
      socket = TCPSocket.new(uri.host, uri.port)
      begin
        request.each_char do |char|
          break if now >= finish

          socket.write(char)
          sleep 0.2
        end
        socket.read if now < finish && socket.wait_readable([finish - now, 0].max)
      rescue SystemCallError, IOError
        nil # dropped
      ensure
        socket.close
      end
    end
  rescue SystemCallError
    nil
  end

  def drain(queue)
    items = []
    items << queue.pop until queue.empty?
    items
  end
end
