# frozen_string_literal: true

require "socket"
require "io/wait"
require "zlib"
require "uri"
require "securerandom"
require_relative "profile_file"

module Strobe
  # The HTTP side of `strobe serve`: inside the profiled process, threads of
  # Strobe's own (never profiled themselves) serve the profile collected so
  # far on 127.0.0.1 only, under a secret path:
  #
  #   GET /TOKEN/profile.json   the profile so far (a snapshot: profiling
  #                             goes on) as Firefox Profiler JSON; readable
  #                             cross-origin by https://profiler.firefox.com
  #                             only, so that its from-url/... link can load it
  #   GET /TOKEN/strobe.json    the same in Strobe's own file format (what
  #                             Strobe.save writes and `strobe report URL`
  #                             reads); not readable cross-origin
  #   GET /TOKEN/               a page linking to both and to the profiler
  #
  # TOKEN is 128 random bits, printed in the URLs only: pasted links work,
  # nothing else can guess them (any other path is 404, the token compared
  # in constant time). A request whose Host is not 127.0.0.1:PORT or
  # localhost:PORT (both name this listener and no one else's: a page from
  # another host name resolved to 127.0.0.1, DNS rebinding, has its own name
  # in Host) is refused with 403.
  #
  # One thread accepts connections and reads their requests, all at once,
  # each within REQUEST_TIMEOUT (an idle or slow connection costs a slot of
  # MAX_PENDING, never anyone's wait); HANDLERS threads answer complete
  # requests, each response within RESPONSE_TIMEOUT. A connection beyond
  # MAX_PENDING, or a request beyond MAX_QUEUED waiting for a handler, gets
  # 503 at once. Requests close together for one format share one snapshot
  # (Snapshots): building one holds the GVL, so the program pauses while it
  # is built.
  #
  # Accept errors that pass (out of descriptors or memory, a connection
  # aborted) are retried after a pause. Forked children close the listening
  # socket (in Strobe's fork handler), so the port is free once this process
  # ends. Started by lib/strobe/autorun.rb when STROBE_SERVE is set (see
  # `strobe serve --help`).
  class Serve
    PROFILE = "profile.json"
    STROBE_PROFILE = "strobe.json"
    # The formats served, by file name.
    FORMATS = { PROFILE => :firefox, STROBE_PROFILE => :json }.freeze
    PROFILER_ORIGIN = "https://profiler.firefox.com"
    PROFILER = "#{PROFILER_ORIGIN}/from-url/"
    TOKEN_BYTES = 16
    REQUEST_TIMEOUT = 5
    RESPONSE_TIMEOUT = 10
    MAX_REQUEST = 16 * 1024
    HANDLERS = 4
    # Seconds between the accept thread's looks at the handlers (the
    # program may kill them).
    WATCH = 1.0
    MAX_PENDING = 32
    MAX_QUEUED = 16
    # accept(2) failures that pass: retried after a Pause.
    ACCEPT_ERRORS = [Errno::EMFILE, Errno::ENFILE, Errno::ENOBUFS, Errno::ENOMEM, Errno::ECONNABORTED,
                     Errno::EINTR, Errno::EPROTO, Errno::EPERM].freeze
    BACKOFF = 0.05
    MAX_BACKOFF = 1.0

    # A client too slow to send its request or take the response.
    class Timeout < StandardError; end

    # Writes to a socket until a deadline, and while the client takes what
    # is written: one that takes nothing for STALL seconds is dropped, so a
    # client that never reads holds a handler that long, not the whole
    # response deadline (review: eight of them delayed others by 20 s).
    class DeadlineWriter
      STALL = 2

      def initialize(io, deadline)
        @io = io
        @deadline = deadline
      end

      # The seconds a wait may take now: to the deadline, at most STALL;
      # nil when none are left.
      def left
        left = @deadline - Serve.now
        [left, STALL].min if left.positive?
      end

      def write(data)
        data = data.b unless data.encoding == Encoding::BINARY
        until data.empty?
          written = @io.write_nonblock(data, exception: false)
          if written == :wait_writable
            raise Timeout, "a client did not take its response in time" unless (wait = left) && @io.wait_writable(wait)

            next
          end
          data = data.byteslice(written..)
        end
        self
      end

      def flush
        self
      end
    end

    # A response body built once and written to any number of clients: the
    # chunks an exporter wrote (it hands over a new String each time).
    class Body
      attr_reader :bytesize

      def initialize
        @chunks = []
        @bytesize = 0
      end

      def write(data)
        data = data.b unless data.encoding == Encoding::BINARY
        @chunks << data
        @bytesize += data.bytesize
        data.bytesize
      end

      def each_chunk(&block)
        @chunks.each(&block)
      end

      # The same bytes gzipped, as another Body (zlib works without the GVL).
      def gzip
        gz = Zlib::GzipWriter.new(Body.new)
        each_chunk { |chunk| gz.write(chunk) }
        gz.finish
      end
    end

    # The profile so far in one format (:firefox or :json, Strobe's own),
    # exported once and shared by the requests for that format that come
    # while it is fresh: for FRESH seconds after it was built, and at least
    # FRESH_PER_BUILD times as long as building it took: building holds the
    # GVL, and this way a client asking in a loop pauses the program for at
    # most about a fifth of its time. One build at a time (of any format);
    # requests that come meanwhile wait for it.
    class Snapshots
      FRESH = 1.0
      FRESH_PER_BUILD = 4

      # Builds of every format.
      attr_reader :builds

      # One format's export: plain and, once asked for, gzipped.
      Export = Struct.new(:plain, :gzipped, :expires)

      def initialize(fresh: FRESH)
        @fresh = fresh
        @lock = Mutex.new
        @exports = Hash.new { |exports, format| exports[format] = Export.new(nil, nil, -Float::INFINITY) }
        @builds = 0
      end

      # The profile so far in format (gzipped if asked), a Body; nil while
      # profiling has not started.
      def fetch(format = :firefox, gzip: false)
        @lock.synchronize do
          export = @exports[format]
          build(export, format) if Serve.now >= export.expires
          next nil unless export.plain

          gzip ? (export.gzipped ||= export.plain.gzip) : export.plain
        end
      end

      private

      def build(export, format)
        export.plain = export.gzipped = nil # the old one can go while the new one is built
        export.expires = -Float::INFINITY
        started = Serve.now
        result = Strobe.snapshot
        return unless result

        body = Body.new
        if format == :firefox
          Native.export_firefox(result, nil, body)
        else
          ProfileFile.write_to(result, body, format)
        end
        export.plain = body
        @builds += 1
        finished = Serve.now
        export.expires = finished + [@fresh, FRESH_PER_BUILD * (finished - started)].max
      end
    end

    # How long to stop accepting after an accept error that passes (no
    # descriptor left, say: the connection waits in the backlog): BACKOFF,
    # doubled at each error in a row up to MAX_BACKOFF; none once one
    # succeeds.
    class Pause
      attr_reader :ends

      def initialize
        @length = @ends = nil
      end

      def accepting?
        @ends.nil? || Serve.now >= @ends
      end

      # Starts or lengthens the pause; true for the first error in a row.
      def failed
        first = @length.nil?
        @length = first ? BACKOFF : [@length * 2, MAX_BACKOFF].min
        @ends = Serve.now + @length
        first
      end

      def succeeded
        @length = @ends = nil
      end
    end

    # A request's line and headers.
    Request = Struct.new(:verb, :target, :headers) do
      # Parses what came before the blank line; nil when it is not HTTP, or
      # is ambiguous: a header line folded onto the one before, a field
      # name with spaces, or two Host fields (RFC 9112 says 400 for each;
      # a proxy and this server could take different ones for the Host).
      def self.parse(head)
        line, *lines = head.split("\r\n")
        verb, target, version = line.to_s.split(" ", 3)
        return nil unless verb && target&.start_with?("/") && version&.start_with?("HTTP/")

        headers = {}
        lines.each do |field|
          name, value = field.split(":", 2)
          return nil unless value && name.match?(/\A[!#$%&'*+.^_`|~0-9A-Za-z-]+\z/)

          name = name.downcase
          return nil if name == "host" && headers.key?(name)

          headers[name] = value.strip
        end
        new(verb, target, headers)
      end

      def path
        target.split("?", 2).first
      end

      # A header's value by its lowercase name; nil when absent.
      def header(name)
        headers[name]
      end
    end

    # A connection whose request is still arriving, until its deadline.
    class Incoming
      attr_reader :socket, :deadline

      def initialize(socket, deadline)
        @socket = socket
        @deadline = deadline
        @data = +""
      end

      # Reads what has arrived: nil while the request is incomplete, a
      # Request, :bad (not HTTP, or too large) or :gone (closed early).
      def read
        chunk = @socket.read_nonblock(4096, exception: false)
        return nil if chunk == :wait_readable
        return :gone if chunk.nil?

        @data << chunk
        return :bad if @data.bytesize > MAX_REQUEST
        return nil unless (ends = @data.index("\r\n\r\n"))

        Request.parse(@data[0, ends]) || :bad
      rescue SystemCallError, IOError
        :gone
      end
    end

    class << self
      def now
        Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end

      # Compares a and b without stopping at the first difference, so the
      # time taken says nothing of how much of the secret b a guess had.
      def secure_equal?(a, b)
        return false unless a.bytesize == b.bytesize

        diff = 0
        a.bytes.each_with_index { |byte, i| diff |= byte ^ b.getbyte(i) }
        diff.zero?
      end

      # The Serve whose listening socket forked children close.
      attr_accessor :closing_in_children
    end

    attr_reader :port, :token, :snapshots

    # Binds 127.0.0.1:port (0: any free port); raises SystemCallError when
    # it cannot (the port is taken). The deadlines (seconds) and how long a
    # snapshot stays fresh can be changed (tests do).
    def initialize(port, err: $stderr, request_timeout: REQUEST_TIMEOUT, response_timeout: RESPONSE_TIMEOUT,
                   fresh: Snapshots::FRESH)
      @request_timeout = seconds(:request_timeout, request_timeout)
      @response_timeout = seconds(:response_timeout, response_timeout)
      fresh = seconds(:fresh, fresh)
      @server = TCPServer.new("127.0.0.1", port)
      @port = @server.addr[1]
      @err = err
      @token = SecureRandom.hex(TOKEN_BYTES)
      @hosts = ["127.0.0.1:#{@port}", "localhost:#{@port}"].freeze
      @snapshots = Snapshots.new(fresh: fresh)
      @requests = Queue.new
      @handlers = []
      @stopped = false
      Native.close_in_children(@server.fileno)
      Serve.closing_in_children = self
    rescue StandardError
      @server&.close
      raise
    end

    # The page linking to the profile and to the profiler.
    def page_url
      "http://127.0.0.1:#{@port}/#{@token}/"
    end

    # The Firefox Profiler JSON.
    def url
      "#{page_url}#{PROFILE}"
    end

    # Strobe's own file format.
    def strobe_url
      "#{page_url}#{STROBE_PROFILE}"
    end

    def profiler_url
      "#{PROFILER}#{URI.encode_www_form_component(url)}"
    end

    # Starts the server threads; returns once they are excluded from
    # profiling, so that profiling started afterwards never samples them.
    def start
      revive
      self
    end

    # Whether the server threads are all alive (the program may kill them).
    def serving?
      !@stopped && [@acceptor, *@handlers].all? { |thread| thread&.alive? }
    end

    # Starts again any server thread that is not alive (a program that kills
    # every other thread kills them too); returns whether it serves.
    def revive
      return false if @stopped || @server.closed?

      @acceptor = start_thread("strobe serve") { accept_loop } unless @acceptor&.alive?
      @handlers = Array.new(HANDLERS) do |i|
        handler = @handlers[i]
        handler&.alive? ? handler : start_thread("strobe serve #{i + 1}") { handle_loop }
      end
      true
    rescue ThreadError => e # no more threads
      note "cannot start a thread: #{e.message}"
      false
    end

    # Stops serving: the threads end, the port is closed, and forked
    # children no longer replace its descriptor (a file may reuse it).
    def stop
      @stopped = true
      threads = [@acceptor, *@handlers].compact
      threads.each(&:kill)
      @requests.close
      threads.each { |thread| finish(thread) }
      @server.close unless @server.closed?
      nil
    ensure
      if Serve.closing_in_children.equal?(self)
        Native.close_in_children(nil)
        Serve.closing_in_children = nil
      end
    end

    private

    def seconds(name, value)
      return value if value.is_a?(Numeric) && value.positive? && value.finite?

      raise ArgumentError, "#{name} must be a positive number of seconds, got #{value.inspect}"
    end

    # Waits a little for a killed thread to end (its ensure closes its
    # sockets); what it died of was reported as it died.
    def finish(thread)
      thread.join(1) unless thread == Thread.current
    rescue StandardError
      nil
    end

    def start_thread(name)
      ready = Queue.new
      thread = Thread.new do
        Native.exclude_current_thread
        ready << true
        yield
      end
      thread.name = name
      ready.pop
      thread
    end

    # Accepts connections and reads their requests, all at once, until the
    # server is stopped. A connection still incomplete at its deadline is
    # closed; a complete request goes to the handlers.
    def accept_loop
      incoming = {}
      pause = Pause.new
      until @stopped
        revive_handlers
        accepting = pause.accepting?
        readable, = IO.select(accepting ? [@server, *incoming.keys] : incoming.keys, nil, nil,
                              wait_time(incoming, (pause.ends unless accepting)))
        readable&.each do |io|
          if io.equal?(@server)
            accept(incoming, pause)
          elsif (request = incoming[io].read)
            incoming.delete(io)
            request == :gone ? io.close : hand_over(io, request)
          end
        end
        expire(incoming)
      end
    rescue IOError, Errno::EBADF
      nil # the server was closed
    ensure
      incoming&.each_key { |io| io.close unless io.closed? }
    end

    # Seconds until the earliest deadline (of a request, or of the pause in
    # accepting), at most WATCH.
    def wait_time(incoming, pause_ends)
      deadlines = incoming.each_value.map(&:deadline)
      deadlines << pause_ends if pause_ends
      return WATCH if deadlines.empty?

      [[deadlines.min - Serve.now, 0].max, WATCH].min
    end

    # Starts again any handler the program killed (the accept thread itself
    # is started again at exit: revive).
    def revive_handlers
      return if @handlers.all?(&:alive?)

      @handlers = @handlers.each_with_index.map do |handler, i|
        handler.alive? ? handler : start_thread("strobe serve #{i + 1}") { handle_loop }
      end
    rescue ThreadError => e
      note "cannot start a thread: #{e.message}"
    end

    def accept(incoming, pause)
      socket = @server.accept_nonblock(exception: false)
      pause.succeeded
      return if socket == :wait_readable # it went away before we took it

      if incoming.size >= MAX_PENDING
        refuse(socket, "too many connections")
      else
        incoming[socket] = Incoming.new(socket, Serve.now + @request_timeout)
      end
    rescue *ACCEPT_ERRORS => e
      note "cannot accept a connection (#{e.message}); retrying" if pause.failed
    end

    def expire(incoming)
      time = Serve.now
      incoming.delete_if do |io, connection|
        next false if connection.deadline > time

        io.close
        true
      end
    end

    def hand_over(socket, request)
      return refuse(socket, "too many requests") if @requests.size >= MAX_QUEUED

      @requests << [socket, request]
    rescue ClosedQueueError
      socket.close
    end

    # A 503 that fits the socket's buffer, sent without waiting, and closed
    # (what the client sent is read first: closing with it unread would
    # reset the connection, and the 503 could be lost).
    def refuse(socket, why)
      body = "busy: #{why}, try again\n"
      socket.read_nonblock(MAX_REQUEST, exception: false)
      socket.write_nonblock(head(503, "text/plain", body.bytesize) + body, exception: false)
    rescue StandardError
      nil
    ensure
      socket.close
    end

    # Answers the requests the accepting thread hands over, until stopped.
    def handle_loop
      while (job = @requests.pop)
        socket, request = job
        begin
          answer(socket, request)
        rescue Timeout => e
          note e.message
        rescue StandardError => e
          # A client that went away, or a request we could not answer: the
          # program being profiled must not notice.
          note "a request failed: #{e.class}: #{e.message.lines.first&.chomp}"
        ensure
          socket.close unless socket.closed?
        end
      end
    end

    def answer(socket, request)
      out = DeadlineWriter.new(socket, Serve.now + @response_timeout)
      return respond(out, 400, "bad request\n") unless request.is_a?(Request)
      unless @hosts.include?(request.header("host").to_s.downcase)
        return respond(out, 403, "this server answers requests for 127.0.0.1:#{@port} only\n")
      end

      _, token, rest = request.path.split("/", 3)
      return respond(out, 404, "not found\n") unless token && Serve.secure_equal?(token, @token)

      case [request.verb, rest.to_s]
      in ["GET", PROFILE | STROBE_PROFILE] then send_profile(out, request, FORMATS.fetch(rest))
      in ["GET", ""] then respond(out, 200, index_page, type: "text/html; charset=utf-8")
      in ["OPTIONS", _] then respond(out, 204, "", extra: cors(request, preflight: true))
      in ["GET", _] then respond(out, 404, "not found: #{url} and #{strobe_url} have the profile\n")
      else respond(out, 405, "only GET\n", extra: ["Allow: GET, OPTIONS"])
      end
    end

    # The profile so far in format; only the Firefox export is for the
    # Firefox Profiler's page to read.
    def send_profile(out, request, format)
      gzip = request.header("accept-encoding").to_s.split(",").any? { |e| e.strip.start_with?("gzip") }
      body = @snapshots.fetch(format, gzip: gzip)
      return respond(out, 503, "no profile: profiling has not started\n") unless body

      extra = format == :firefox ? cors(request) : []
      extra << "Content-Encoding: gzip" if gzip
      out.write(head(200, "application/json", body.bytesize, extra))
      body.each_chunk { |chunk| out.write(chunk) }
    end

    # The CORS headers: only the Firefox Profiler may read the profile from
    # another origin (its from-url fetch), and it is named, never `*`.
    def cors(request, preflight: false)
      lines = ["Vary: Origin"]
      return lines unless request.header("origin") == PROFILER_ORIGIN

      lines << "Access-Control-Allow-Origin: #{PROFILER_ORIGIN}"
      if preflight
        lines << "Access-Control-Allow-Methods: GET"
        # Chrome's private network access: a public page asking for 127.0.0.1
        lines << "Access-Control-Allow-Private-Network: true" if request.header("access-control-request-private-network")
      end
      lines
    end

    def respond(out, status, body, type: "text/plain", extra: [])
      out.write(head(status, (type unless body.empty?), body.bytesize, extra) + body)
    end

    REASONS = { 200 => "OK", 204 => "No Content", 400 => "Bad Request", 403 => "Forbidden", 404 => "Not Found",
                405 => "Method Not Allowed", 503 => "Service Unavailable" }.freeze

    # The status line and headers.
    def head(status, type, length, extra = [])
      lines = ["HTTP/1.1 #{status} #{REASONS.fetch(status)}", "Cache-Control: no-store", "Connection: close",
               "Referrer-Policy: no-referrer", "X-Content-Type-Options: nosniff", *extra]
      lines << "Content-Type: #{type}" if type
      lines << "Content-Length: #{length}" unless status == 204
      "#{lines.join("\r\n")}\r\n\r\n"
    end

    def index_page
      <<~HTML
        <!DOCTYPE html>
        <html><head><meta charset="utf-8"><meta name="referrer" content="no-referrer">
        <title>Strobe: profile of #{Process.pid}</title></head>
        <body><h1>Strobe is profiling process #{Process.pid}</h1>
        <p><a href="#{profiler_url}">Open the profile so far in the Firefox Profiler</a>
        (it fetches <a href="#{url}">#{url}</a>).</p>
        <p>The profile so far in Strobe's own file format: <a href="#{strobe_url}">#{strobe_url}</a>
        (<code>strobe report #{strobe_url}</code>).</p></body></html>
      HTML
    end

    def note(message)
      @err.puts "strobe serve: #{message}"
    rescue StandardError
      nil
    end
  end
end
