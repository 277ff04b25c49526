# frozen_string_literal: true

require "socket"
require "io/wait"
require "ipaddr"
require_relative "redact"

module Strobe
  # The HTTP core Strobe's servers share (Strobe::Serve, the profile for the
  # Firefox Profiler; Strobe::Continuous::PullServer, pprof for scrapers):
  # a small server that runs inside the profiled process on threads of its
  # own, never profiled themselves, and that nothing a client does can
  # stall. A subclass binds it where it likes and answers requests (route);
  # this class owns the rest:
  #
  # One thread accepts connections and reads their requests, all at once,
  # each whole head within REQUEST_TIMEOUT (an idle or slow connection
  # costs one of MAX_PENDING places, never anyone's wait), and screens each
  # head as it is complete: what the subclass refuses (no token, say) is
  # answered there and then with a few bytes that fit the socket's buffer,
  # so only requests that passed ever wait for one of the HANDLERS threads
  # (MAX_QUEUED of them at most: beyond, 503).
  #
  # The places for heads still arriving are shared by address groups
  # (Incoming#group: an IPv4 address, an IPv6 /64, loopback as one): a new
  # connection whose group holds its share (max_pending_per_peer), or that
  # finds every place taken, takes the place of the oldest connection of
  # its group, or of the group holding the most, which gets 503. So slow
  # connections, from however many addresses, never keep a new one out: a
  # scraper sends its head at once and is read before anyone's newer
  # connection could push it out.
  #
  # A response may take as long as the subclass needs to produce it (a
  # profile over N seconds); the client then has RESPONSE_TIMEOUT seconds to
  # take it, and is dropped once it takes nothing for DeadlineWriter::STALL
  # seconds.
  #
  # Accept errors that pass (out of descriptors or memory, a connection
  # aborted) are retried after a Pause. Threads the program kills are
  # started again (revive; the accept thread starts dead handlers itself).
  class HTTPServer
    # Seconds a client has to send its whole request head.
    REQUEST_TIMEOUT = 3
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
    #
    # The deadline is a time (HTTPServer.now + seconds), or, with within:,
    # that many seconds from the first write: what the client has to take
    # the response, however long producing it took.
    class DeadlineWriter
      STALL = 2

      def initialize(io, deadline = nil, within: nil)
        raise ArgumentError, "a deadline or within: seconds, not both" unless deadline.nil? ^ within.nil?

        @io = io
        @deadline = deadline
        @within = within
      end

      # The seconds a wait may take now: to the deadline, at most STALL;
      # nil when none are left.
      def left
        left = @deadline - HTTPServer.now
        [left, STALL].min if left.positive?
      end

      # Writes all of data, or raises Timeout.
      def write(data)
        @deadline ||= HTTPServer.now + @within
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
        @ends.nil? || HTTPServer.now >= @ends
      end

      # Starts or lengthens the pause; true for the first error in a row.
      def failed
        first = @length.nil?
        @length = first ? BACKOFF : [@length * 2, MAX_BACKOFF].min
        @ends = HTTPServer.now + @length
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

      # What follows the "?" of the target, undecoded; nil when none.
      def query
        target.split("?", 2)[1]
      end

      # A header's value by its lowercase name; nil when absent.
      def header(name)
        headers[name]
      end
    end

    # A connection whose request is still arriving, until its deadline.
    class Incoming
      attr_reader :socket, :deadline, :group

      # The group an address (an Addrinfo) shares its places with: an IPv4
      # address; an IPv6 /64 (what one host commonly holds); the loopback
      # addresses (127.0.0.0/8, ::1) as one, since any local user has all
      # of them. An IPv4 address mapped into IPv6 is the IPv4 one.
      def self.group_of(address)
        address = HTTPServer.unmapped(address)
        return "loopback" if HTTPServer.loopback?(address)
        return address.ip_address unless address.ipv6?

        "#{IPAddr.new(address.ip_address.sub(/%.*/, '')).mask(64)}/64"
      rescue StandardError
        address.inspect_sockaddr
      end

      def initialize(socket, deadline, group)
        @socket = socket
        @deadline = deadline
        @group = group
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
      # Seconds by the monotonic clock: what every deadline here is in.
      def now
        Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end

      # address (an Addrinfo), as IPv4 when it is an IPv4 address mapped
      # into IPv6 (::ffff:a.b.c.d).
      def unmapped(address)
        address.ipv6? && address.ipv6_v4mapped? ? address.ipv6_to_ipv4 : address
      end

      # Whether address (an Addrinfo) is a loopback one: 127.0.0.0/8 or ::1
      # (mapped into IPv6 or not).
      def loopback?(address)
        address = unmapped(address)
        address.ipv4_loopback? || address.ipv6_loopback?
      end

      # Compares a and b without stopping at the first difference, so the
      # time taken says nothing of how much of the secret b a guess had.
      def secure_equal?(a, b)
        return false unless a.bytesize == b.bytesize

        diff = 0
        a.bytes.each_with_index { |byte, i| diff |= byte ^ b.getbyte(i) }
        diff.zero?
      end
    end

    attr_reader :port

    # Binds host:port (port 0: any free one); raises SystemCallError when it
    # cannot (the port is taken). name names the threads ("NAME", "NAME 1"
    # ...) and starts the lines written to err. The deadlines are in
    # seconds: request_timeout to send a request, response_timeout to take
    # a response once its first byte is written.
    def initialize(host, port, name:, err: $stderr, request_timeout: REQUEST_TIMEOUT,
                   response_timeout: RESPONSE_TIMEOUT)
      @request_timeout = seconds(:request_timeout, request_timeout)
      @response_timeout = seconds(:response_timeout, response_timeout)
      @name = name
      @err = err
      @server = listen(host, port)
      @port = @server.addr[1]
      @requests = Queue.new
      @handlers = []
      @stopped = false
    rescue StandardError
      @server&.close
      raise
    end

    # Its name and port: not its token (a subclass's), nor the requests it
    # holds.
    def inspect
      Redact.inspect(self, name: @name, port: @port)
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

      @acceptor = start_thread(@name) { accept_loop } unless @acceptor&.alive?
      @handlers = Array.new(HANDLERS) do |i|
        handler = @handlers[i]
        handler&.alive? ? handler : start_handler(i)
      end
      true
    rescue ThreadError => e # no more threads
      note "cannot start a thread: #{e.message}"
      false
    end

    # Stops serving: the threads end (a handler mid-response is killed) and
    # the port is closed.
    def stop
      @stopped = true
      threads = [@acceptor, *@handlers].compact
      threads.each(&:kill)
      @requests.close
      threads.each { |thread| finish(thread) }
      @server.close unless @server.closed?
      nil
    end

    private

    # The listening socket (a subclass may bind otherwise).
    def listen(host, port)
      TCPServer.new(host, port)
    end

    # Answers one complete request (request is a Request that screen
    # passed) by writing its response to out: what a subclass serves.
    def route(_request, _out)
      raise NotImplementedError, "#{self.class} answers no requests"
    end

    # The writer of a response: the client has response_timeout seconds to
    # take it from its first byte on, however long producing it took.
    def writer(socket)
      DeadlineWriter.new(socket, within: @response_timeout)
    end

    # value, checked to be a positive number of seconds (name says which).
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

    # A thread named name running the block, once it is excluded from
    # profiling.
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

    # Handler number index + 1.
    def start_handler(index)
      start_thread("#{@name} #{index + 1}") { handle_loop }
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
          elsif (request = incoming[io]&.read) # (nil: pushed out by a connection accepted just now)
            incoming.delete(io)
            dispatch(io, request)
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

      [[deadlines.min - HTTPServer.now, 0].max, WATCH].min
    end

    # Starts again any handler the program killed (the accept thread itself
    # is started again at exit: revive).
    def revive_handlers
      return if @handlers.all?(&:alive?)

      @handlers = @handlers.each_with_index.map do |handler, i|
        handler.alive? ? handler : start_handler(i)
      end
    rescue ThreadError => e
      note "cannot start a thread: #{e.message}"
    end

    # Takes a connection waiting; its request is read from now on, until
    # request_timeout (what has arrived already, at once), in a place made
    # for it if none is free (make_room).
    def accept(incoming, pause)
      socket = @server.accept_nonblock(exception: false)
      pause.succeeded
      return if socket == :wait_readable # it went away before we took it

      connection = Incoming.new(socket, HTTPServer.now + @request_timeout, address_group(socket))
      request = connection.read
      return dispatch(socket, request) if request

      make_room(incoming, connection.group)
      incoming[socket] = connection
    rescue *ACCEPT_ERRORS => e
      note "cannot accept a connection (#{e.message}); retrying" if pause.failed
    end

    # Frees a place for a connection of group when there is none: its
    # group's oldest when the group holds max_pending_per_peer, else, when
    # all MAX_PENDING are taken, the oldest of the group holding the most.
    # That one gets 503. (incoming is oldest first: a Hash keeps its order.)
    def make_room(incoming, group)
      counts = incoming.each_value.map(&:group).tally
      crowded = if counts.fetch(group, 0) >= max_pending_per_peer then group
                elsif incoming.size >= MAX_PENDING then counts.max_by { |_, count| count }.first
                end
      return unless crowded

      oldest, = incoming.find { |_, other| other.group == crowded }
      incoming.delete(oldest)
      refuse(oldest, "too many connections")
    end

    # The address group a connection shares its places with
    # (Incoming.group_of); nil when its address cannot be had.
    def address_group(socket)
      Incoming.group_of(socket.remote_address)
    rescue SystemCallError, IOError, SocketError
      nil
    end

    # How many heads one address group may have arriving at once: all of
    # MAX_PENDING here (strobe serve's clients are all on loopback, one
    # group); a server others reach sets fewer, so that one slow client
    # pushes out its own connections before anyone else's.
    def max_pending_per_peer
      MAX_PENDING
    end

    # What the accept thread does with what a connection sent: nothing when
    # it went away, 400 when it is no request, what screen says, or else
    # queues it for the handlers.
    def dispatch(socket, request)
      return socket.close if request == :gone
      return answer_now(socket, 400, "bad request\n") unless request.is_a?(Request)

      status, body, extra = screen(request)
      return answer_now(socket, status, body, extra || []) if status

      revive_handlers # (all of them, before one of them answers this request)
      hand_over(socket, request)
    end

    # What the accept thread answers at once, the request never reaching a
    # handler: [status, body, extra header lines] (a body of a few bytes),
    # or nil to answer it in route. A subclass refuses here what it would
    # refuse without any work (a missing token).
    def screen(_request)
      nil
    end

    # Closes the connections whose request did not come in time.
    def expire(incoming)
      time = HTTPServer.now
      incoming.delete_if do |io, connection|
        next false if connection.deadline > time

        io.close
        true
      end
    end

    # Queues a request for the handlers (503 beyond MAX_QUEUED).
    def hand_over(socket, request)
      return refuse(socket, "too many requests") if @requests.size >= MAX_QUEUED

      @requests << [socket, request]
    rescue ClosedQueueError
      socket.close
    end

    # A 503, answered at once.
    def refuse(socket, why)
      answer_now(socket, 503, "busy: #{why}, try again\n")
    end

    # A short response that fits the socket's buffer, sent without waiting,
    # and the connection closed (what the client sent is read first:
    # closing with it unread would reset the connection, and the response
    # could be lost).
    def answer_now(socket, status, body, extra = [])
      socket.read_nonblock(MAX_REQUEST, exception: false)
      socket.write_nonblock(head(status, "text/plain", body.bytesize, extra) + body, exception: false)
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

    # Answers a request the accept thread passed (screen).
    def answer(socket, request)
      route(request, writer(socket))
    end

    # A whole response: status, headers (extra lines too) and body.
    def respond(out, status, body, type: "text/plain", extra: [])
      out.write(head(status, (type unless body.empty?), body.bytesize, extra) + body)
    end

    REASONS = { 200 => "OK", 204 => "No Content", 400 => "Bad Request", 401 => "Unauthorized", 403 => "Forbidden",
                404 => "Not Found", 405 => "Method Not Allowed", 500 => "Internal Server Error",
                503 => "Service Unavailable" }.freeze

    # The status line and headers.
    def head(status, type, length, extra = [])
      lines = ["HTTP/1.1 #{status} #{REASONS.fetch(status)}", "Cache-Control: no-store", "Connection: close",
               "Referrer-Policy: no-referrer", "X-Content-Type-Options: nosniff", *extra]
      lines << "Content-Type: #{type}" if type
      lines << "Content-Length: #{length}" unless status == 204
      "#{lines.join("\r\n")}\r\n\r\n"
    end

    # A line on err (never an error of its own).
    def note(message)
      @err.puts "#{@name}: #{message}"
    rescue StandardError
      nil
    end
  end
end
