# frozen_string_literal: true

require "socket"
require "io/wait"
require "zlib"
require "uri"

module Strobe
  # The HTTP side of `strobe serve`: inside the profiled process, a thread
  # of Strobe's own (never profiled itself) serves the profile collected so
  # far, as Firefox Profiler JSON, on 127.0.0.1 only:
  #
  #   GET /profile.json   the profile so far (a snapshot: profiling goes on),
  #                       with Access-Control-Allow-Origin: * so that
  #                       https://profiler.firefox.com/from-url/... can load it
  #   GET /               a page linking to it and to the profiler
  #
  # Connections are served one at a time, each within deadlines: a request
  # not complete within REQUEST_TIMEOUT seconds, or a response the client
  # has not taken within RESPONSE_TIMEOUT, is dropped, so one stalled client
  # cannot keep others waiting. Forked children close the listening socket
  # (in Strobe's fork handler), so the port is free once this process ends.
  # Started by lib/strobe/autorun.rb when STROBE_SERVE is set (see
  # `strobe serve --help`).
  class Serve
    PATH = "/profile.json"
    REQUEST_TIMEOUT = 5
    RESPONSE_TIMEOUT = 10
    MAX_REQUEST = 16 * 1024

    # A client too slow to send its request or take the response.
    class Timeout < StandardError; end

    # Writes to a socket until a deadline: what the exporters stream into.
    class DeadlineWriter
      def initialize(io, deadline)
        @io = io
        @deadline = deadline
      end

      def write(data)
        data = data.b
        until data.empty?
          written = @io.write_nonblock(data, exception: false)
          if written == :wait_writable
            left = @deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
            raise Timeout, "the client did not take the response in #{RESPONSE_TIMEOUT} s" unless left.positive? && @io.wait_writable(left)
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
    PROFILER = "https://profiler.firefox.com/from-url/"

    attr_reader :port

    # Binds 127.0.0.1:port (0: any free port); raises SystemCallError when
    # it cannot (the port is taken).
    def initialize(port, err: $stderr)
      @server = TCPServer.new("127.0.0.1", port)
      @port = @server.addr[1]
      @err = err
      Native.close_in_children(@server.fileno)
    end

    def url
      "http://127.0.0.1:#{@port}#{PATH}"
    end

    def profiler_url
      "#{PROFILER}#{URI.encode_www_form_component(url)}"
    end

    # Starts the server thread; returns once that thread is excluded from
    # profiling, so that profiling started afterwards never samples it.
    def start
      ready = Queue.new
      @thread = Thread.new do
        Native.exclude_current_thread
        ready << true
        serve_forever
      end
      @thread.name = "strobe serve"
      ready.pop
      self
    end

    def stop
      @thread&.kill
      @server.close unless @server.closed?
    end

    private

    def serve_forever
      loop do
        client = @server.accept
        begin
          handle(client)
        rescue Timeout => e
          note e.message
        rescue StandardError => e
          # A client that went away, or a request we could not answer: the
          # program being profiled must not notice.
          note "a request failed: #{e.class}: #{e.message.lines.first&.chomp}"
        ensure
          client.close unless client.closed?
        end
      end
    rescue IOError, SystemCallError
      nil # the server was closed
    end

    def handle(client)
      request = read_request(client)
      out = DeadlineWriter.new(client, now + RESPONSE_TIMEOUT)
      return respond(out, 400, "text/plain", "bad request\n") unless request

      method, target, headers = request
      path = target.split("?", 2).first
      case [method, path]
      in ["GET", PATH] then send_profile(out, headers)
      in ["GET", "/"] then respond(out, 200, "text/html; charset=utf-8", index_page)
      in ["OPTIONS", _] then respond(out, 204, nil, "")
      in ["GET", _] then respond(out, 404, "text/plain", "not found: #{PATH} has the profile\n")
      else respond(out, 405, "text/plain", "only GET\n")
      end
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end

    # [method, target, {header => value}] or nil for a request that is not
    # HTTP, too large, or not complete within REQUEST_TIMEOUT.
    def read_request(client)
      data = +""
      deadline = now + REQUEST_TIMEOUT
      until data.include?("\r\n\r\n")
        left = deadline - now
        return nil unless left.positive? && client.wait_readable(left)

        chunk = client.read_nonblock(4096, exception: false)
        return nil if chunk.nil? || data.bytesize > MAX_REQUEST
        next if chunk == :wait_readable

        data << chunk
      end
      head, *lines = data.split("\r\n\r\n", 2).first.split("\r\n")
      method, target, version = head.to_s.split(" ", 3)
      return nil unless method && target&.start_with?("/") && version&.start_with?("HTTP/")

      headers = lines.to_h { |line| k, v = line.split(":", 2); [k.to_s.strip.downcase, v.to_s.strip] }
      [method, target, headers]
    end

    def send_profile(out, headers)
      result = Strobe.snapshot
      return respond(out, 503, "text/plain", "no profile: profiling has not started\n") unless result

      gzip = headers.fetch("accept-encoding", "").split(",").any? { |e| e.strip.start_with?("gzip") }
      out.write(head(200, "application/json", nil, ("Content-Encoding: gzip\r\n" if gzip)))
      if gzip
        Zlib::GzipWriter.wrap(ProfileFile::KeepOpen.new(out)) { |gz| Native.export_firefox(result, nil, gz) }
      else
        Native.export_firefox(result, nil, out)
      end
    end

    def respond(out, status, type, body)
      out.write(head(status, type, body.bytesize) + body)
    end

    REASONS = { 200 => "OK", 204 => "No Content", 400 => "Bad Request", 404 => "Not Found",
                405 => "Method Not Allowed", 503 => "Service Unavailable" }.freeze

    # The status line and headers. Without a length the body runs to the
    # end of the connection.
    def head(status, type, length, extra = nil)
      lines = ["HTTP/1.1 #{status} #{REASONS.fetch(status)}", "Access-Control-Allow-Origin: *",
               "Access-Control-Allow-Methods: GET, OPTIONS", "Cache-Control: no-store", "Connection: close"]
      lines << "Content-Type: #{type}" if type
      lines << "Content-Length: #{length}" if length
      "#{lines.join("\r\n")}\r\n#{extra}\r\n"
    end

    def index_page
      <<~HTML
        <!DOCTYPE html>
        <html><head><meta charset="utf-8"><title>Strobe: profile of #{Process.pid}</title></head>
        <body><h1>Strobe is profiling process #{Process.pid}</h1>
        <p><a href="#{profiler_url}">Open the profile so far in the Firefox Profiler</a>
        (it fetches <a href="#{PATH}">#{url}</a>).</p></body></html>
      HTML
    end

    def note(message)
      @err.puts "strobe serve: #{message}"
    rescue StandardError
      nil
    end
  end
end
